"""Sub-commands of ``dice``: each module defines ``add_parser(subparsers)`` and sets ``func``."""
