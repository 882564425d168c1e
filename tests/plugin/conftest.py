"""The plugin is tested the way users run it: pytest in a subprocess on a small project."""

pytest_plugins = ["pytester"]
