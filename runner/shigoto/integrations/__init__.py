"""Shigoto inside the frameworks services already live in: Django, SQLAlchemy, FastAPI.

Each submodule is an optional extra (`pip install shigoto[django]`) and the only place the
package imports that framework; the core never does (an import-linter contract holds it).
"""
