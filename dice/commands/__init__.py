"""Sub-commands of ``dice``. Each module defines ``add_parser(subparsers)`` and sets ``func`` on its parser."""
