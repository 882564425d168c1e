"""The plugin is tested the way users run it: pytest in a subprocess on a small project.

``pytester`` is enabled by the test module (``pytest_plugins``): pytest only accepts that
variable in the root conftest, which this folder does not own.
"""
