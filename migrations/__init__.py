"""Alembic migrations of the SQL projection (meta/projection). A package so that alembic.ini, env.py and versions/
ship with the code and meta.projection.migrate finds them next to this file, whatever the working directory.

By hand: ``alembic -c migrations/alembic.ini -x url=sqlite:////abs/projection.db upgrade head``.
"""
