"""A store address that hangs up: the fault of a Redis restarting, or of a proxy with no
server behind it."""

from __future__ import annotations

import socket
import threading
import time


class HangingUp:
    """An address that accepts each connection and closes it at once, counting the
    connections."""

    def __init__(self, port: int = 0) -> None:
        self._listener = socket.create_server(("127.0.0.1", port))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}"
        self._accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def accepted(self) -> int:
        """Connections accepted, once every one made so far is (the kernel completes a
        connect before this listener's thread accepts it)."""
        count = -1
        while count != self._accepted:
            count = self._accepted
            time.sleep(0.2)
        return count

    def close(self) -> None:
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._accepted += 1
            connection.close()
