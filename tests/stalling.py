"""A broker address that stops answering: the fault of a partition that drops packets, or
of a hung proxy. Connections stay open; nothing comes back."""

from __future__ import annotations

import contextlib
import socket
import threading


class StallingProxy:
    """A TCP proxy to a local server that forwards until :meth:`stall`, then holds every
    byte (and every new connection) until :meth:`resume`."""

    def __init__(self, port: int) -> None:
        self._target = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open = threading.Event()
        self._open.set()
        threading.Thread(target=self._serve, daemon=True).start()

    def stall(self) -> None:
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.resume()
        self._listener.close()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            self._open.wait()
            upstream = socket.create_connection(("127.0.0.1", self._target))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                self._open.wait()
                dst.sendall(data)
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.close()
