"""Schema hygiene: migrations match the models, and every field explains itself."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.management import call_command


@pytest.mark.django_db
def test_models_have_no_changes_without_a_migration():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)  # exits 1 if missing


@pytest.mark.parametrize("label", ["delayq", "shop"])
def test_every_model_field_has_a_verbose_name_and_help_text(label):
    for model in apps.get_app_config(label).get_models():
        for field in model._meta.get_fields():
            if field.auto_created or not field.concrete:
                continue
            kwargs = field.deconstruct()[3]  # what the model gives explicitly
            assert kwargs.get("verbose_name") and kwargs.get("help_text"), \
                f"{model.__name__}.{field.name} needs verbose_name and help_text"
