"""Schema hygiene: migrations match the models, and every field explains itself."""

from __future__ import annotations

import re

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


#: Words of the code, not of the people who read the admin.
JARGON = re.compile(r"\b(carrier|envelope|journal|stream|dead-letter\w*|delay store|mirror|"
                    r"shard|the call|job|publish\w*|broker)\b", re.I)


@pytest.mark.parametrize("model", ["delayedtask", "delayedtaskevent"])
def test_help_texts_an_operator_reads_are_short_and_free_of_code_words(model):
    for field in apps.get_model("delayq", model)._meta.get_fields():
        if field.auto_created or not field.concrete:
            continue
        text = str(field.help_text)
        assert len(text) <= 120, f"{field.name}: {len(text)} characters"
        assert not JARGON.search(text), f"{field.name}: {text!r}"
