"""The backend's ``DatabaseWrapper`` (see the package docstring)."""

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params):
        connection = super().get_new_connection(conn_params)
        connection.execute("PRAGMA journal_mode=WAL")  # readers and one writer at once
        return connection

    def _start_transaction_under_autocommit(self):
        self.cursor().execute("BEGIN IMMEDIATE")
