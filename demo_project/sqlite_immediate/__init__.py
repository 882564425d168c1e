"""Django's SQLite backend as Django 5.1 configures it with ``transaction_mode: IMMEDIATE``
and WAL, for the demo on older Django (its settings pick it before 5.1).

Several processes write the demo's SQLite file (the web server, the worker, the journal
sync). A transaction SQLite begins deferred takes the write lock at its first write; one
that read first cannot wait for it then, and fails at once with "database is locked" while
another holds it. Begun IMMEDIATE, it waits for the lock up to the ``timeout`` option.
"""
