"""mooncake_go.Store against a master that requires credentials
(``mooncake up --secure``): refused without them, served with them."""

from __future__ import annotations

import uuid

import pytest

import mooncake_go as mg
from mooncake_go import errors

from conftest import LOCAL_BUFFER
from mccluster import start_cluster


@pytest.fixture(scope="module")
def secure_cluster(mooncake_bin, tmp_path_factory):
    d = tmp_path_factory.mktemp("secure")
    c = start_cluster(mooncake_bin, "--no-ha", "--nodes", "1", "--global_segment_size", "64MiB",
                      "--secure", "--secure-dir", str(d))
    yield c, d
    c.stop()


def open_store(master, **creds):
    return mg.Store(master, segment_size=-1, local_buffer_size=LOCAL_BUFFER, local_hostname="127.0.0.1",
                    rpc_timeout_ms=3000, **creds)


def test_credentials(secure_cluster, monkeypatch):
    c, d = secure_cluster
    monkeypatch.delenv("MC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("MC_TE_SECRET", raising=False)
    token = (d / "token").read_text().strip()
    tls = dict(tls_ca_file=str(d / "ca.pem"), tls_cert_file=str(d / "client.pem"),
               tls_key_file=str(d / "client-key.pem"), te_secret=(d / "te_secret").read_text().strip())

    # Plaintext to the TLS master: no connection.
    with pytest.raises(errors.MooncakeError):
        open_store(c.master, auth_token=token)
    # TLS without the token: refused, saying why.
    with pytest.raises(errors.MooncakeError, match="missing bearer token"):
        open_store(c.master, **tls)
    with pytest.raises(errors.MooncakeError, match="wrong bearer token"):
        open_store(c.master, auth_token="other", **tls)
    # Without the Transfer Engine's secret: the master lets it in, the
    # node's engine refuses its transfers.
    no_secret = dict(tls, te_secret=None)
    with open_store(c.master, auth_token=token, **no_secret) as s:
        with pytest.raises(errors.MooncakeError):
            s.put(f"secure-{uuid.uuid4().hex}", b"x")
    # All: served.
    k = f"secure-{uuid.uuid4().hex}"
    with open_store(c.master, auth_token=token, **tls) as s:
        s.put(k, b"secret")
        assert s.get(k) == b"secret"
    # The token from the environment (what the mooncake.store compat
    # module, whose setup has no such argument, relies on).
    monkeypatch.setenv("MC_AUTH_TOKEN", token)
    with open_store(c.master, **tls) as s:
        assert s.get(k) == b"secret"


def test_tls_server_name(secure_cluster, monkeypatch):
    """tls_server_name (ABI 1.12) is the name the master's certificate is
    checked for, not the host dialed: the cluster's certificate names
    localhost and 127.0.0.1, the store dials 127.0.0.1."""
    c, d = secure_cluster
    monkeypatch.delenv("MC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("MC_TE_SECRET", raising=False)
    creds = dict(auth_token=(d / "token").read_text().strip(), tls_ca_file=str(d / "ca.pem"),
                 tls_cert_file=str(d / "client.pem"), tls_key_file=str(d / "client-key.pem"),
                 te_secret=(d / "te_secret").read_text().strip())
    k = f"named-{uuid.uuid4().hex}"
    with open_store(c.master, tls_server_name="localhost", **creds) as s:
        s.put(k, b"named")
        assert s.get(k) == b"named"
    # A name the certificate does not carry: refused, though the host
    # dialed is one it does (a store that ignored the name would connect).
    with pytest.raises(errors.MooncakeError, match="certificate"):
        open_store(c.master, tls_server_name="masters.invalid", **creds)
    # A name without TLS: refused before dialing, not plaintext.
    with pytest.raises(errors.InvalidParams, match="TLS server name"):
        open_store(c.master, tls_server_name="localhost", auth_token=creds["auth_token"])
