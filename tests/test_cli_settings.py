"""`summaryd status` and `summaryd health` reach a daemon that needs a token or (mutual) TLS with the client's
own settings: flags, else SUMMARYD_TOKEN and SUMMARYD_TLS_*."""

from __future__ import annotations

import json
from pathlib import Path

from _credentials import ALICE, Pki, tls_credentials, token_file
from _support import cli, one_line, start_daemon


def test_status_with_a_token(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--token-file", str(token_file(tmp_path / "tokens", f"{ALICE} team-a/")))
    try:
        refused = one_line(cli("status", "--address", daemon.address), 1)
        assert refused.startswith(f"summaryd at {daemon.address}: UNAUTHENTICATED")
        by_env = cli("status", "--json", "--address", daemon.address, env={"SUMMARYD_TOKEN": ALICE})
        assert by_env.returncode == 0, by_env.stderr
        assert json.loads(by_env.stdout)["sessions"] == []
        by_flag = cli("status", "--address", daemon.address, "--token", ALICE)
        assert by_flag.returncode == 0 and "0 open runs" in by_flag.stdout, by_flag.stderr
    finally:
        daemon.terminate()


def test_status_and_health_over_mutual_tls(tmp_path: Path, pki: Pki) -> None:
    daemon = start_daemon(
        tmp_path,
        "--tls-cert",
        str(pki.server_cert),
        "--tls-key",
        str(pki.server_key),
        "--tls-client-ca",
        str(pki.ca),
        credentials=tls_credentials(pki, client_cert=True),
    )
    try:
        flags = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert), "--tls-key", str(pki.client_key)]
        health = cli("health", "--address", daemon.address, *flags)
        assert (health.returncode, health.stdout.strip()) == (0, f"summaryd at {daemon.address}: SERVING")
        env = {
            "SUMMARYD_TLS_CA": str(pki.ca),
            "SUMMARYD_TLS_CERT": str(pki.client_cert),
            "SUMMARYD_TLS_KEY": str(pki.client_key),
        }
        status = cli("status", "--json", "--address", daemon.address, env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["runs"] == []
        # Without its certificate the client is turned away, in one line.
        refused = one_line(cli("health", "--address", daemon.address, "--tls-ca", str(pki.ca)), 1)
        assert refused.startswith(f"summaryd at {daemon.address}: UNAVAILABLE")
        missing = one_line(cli("status", "--address", daemon.address, "--tls-ca", str(tmp_path / "nope.pem")), 1)
        assert "nope.pem" in missing
    finally:
        daemon.terminate()
