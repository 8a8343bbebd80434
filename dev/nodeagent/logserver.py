"""The kubelet's container log endpoint, for the agent's pods: what the API
server proxies ``kubectl logs`` (``GET /api/v1/.../pods/P/log``) to, at the
node's InternalIP and its status's ``daemonEndpoints.kubeletEndpoint.Port``.

Served: ``GET /containerLogs/<namespace>/<pod>/<container>``, the container's
whole log file of the pod's newest run (the agent keeps every run's). Not
served: ``follow``, ``tailLines`` and the rest (400 says so), exec, attach,
port-forward. HTTPS with a self-signed certificate (the API server does not
check the kubelet's unless told to), and no authentication: the agent's
nodes are this machine's test nodes, reachable only from it.
"""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from .pod import pod_runs

SERVED = {"container", "timestamps", "previous"}


def self_signed(folder: Path, host_ip: str) -> tuple[Path, Path]:
    """A certificate and key for ``host_ip`` (openssl, made once per state dir)."""
    cert, key = folder / "kubelet.crt", folder / "kubelet.key"
    if not cert.exists() or not key.exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-keyout", str(key), "-out", str(cert), "-subj", "/CN=torchfleet-node-agent",
             "-addext", f"subjectAltName=IP:{host_ip}"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


def log_file(state_dir: Path, namespace: str, pod: str, container: str) -> Path | None:
    runs = pod_runs(state_dir, namespace, pod)
    return runs[-1] / "logs" / f"{container}.log" if runs else None


def serve(state_dir: Path, host_ip: str) -> int:
    """Starts the endpoint on ``host_ip`` (a free port) in a daemon thread; its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")]
            unsupported = set(parse_qs(url.query)) - SERVED
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/<namespace>/<pod>/<container>")
            elif unsupported:
                self.send_error(400, f"the node agent does not serve {sorted(unsupported)}")
            else:
                found = log_file(state_dir, *parts[1:])
                if found is None or not found.exists():
                    self.send_error(404, f"no log of {'/'.join(parts[1:])} on this node")
                    return
                body = found.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the agent's own log says what matters

    server = http.server.ThreadingHTTPServer((host_ip, 0), Handler)
    cert, key = self_signed(state_dir / "pki", host_ip)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="container-logs", daemon=True).start()
    return int(server.server_address[1])
