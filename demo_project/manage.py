#!/usr/bin/env python
"""Django's command line for the demo shop: ``python demo_project/manage.py <command>``."""

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # not this folder
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
