"""The admin CLI (API.md, "Admin CLI"): one module per noun, built on the client library.

``options`` holds the global options and the error line, ``output`` the tables and JSON. ops/cli.py names each
command's module (``ADMIN_COMMANDS``); a command's module is imported only when the command is named.
"""
