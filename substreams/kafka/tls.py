"""The secured embedded broker's throwaway credentials: a CA, the brokers' certificate and
the admin's password, made once per cluster home with the JDK's ``keytool``.

Why keytool: the broker needs Java anyway, and the project's Python environment has no X.509
library; four keytool runs (~1 s each) make a PKCS#12 keystore the broker reads and a PEM
CA file both clients read (librdkafka's ``ssl.ca.location``, the Java client's PEM
truststore).  The certificate names 127.0.0.1 and localhost, so hostname checks stay on.

Layout under ``<home>/security`` (0700; the secret files 0600)::

    ca.p12, ca.pem           the CA (its key never leaves ca.p12)
    broker.p12               the brokers' key and certificate chain
    store.password           ca.p12's and broker.p12's password
    admin.password           the super user's SCRAM password
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from substreams import jvm
from substreams.errors import BrokerError

ADMIN = "admin"
"""The super user of a secured embedded cluster (brokers log in to each other as it too)."""
VALID_DAYS = 3650


@dataclass(frozen=True)
class Credentials:
    """Where a secured cluster's files are (see the module); no secret is held here."""

    folder: Path

    @property
    def ca_pem(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def keystore(self) -> Path:
        return self.folder / "broker.p12"

    @property
    def store_password_file(self) -> Path:
        return self.folder / "store.password"

    @property
    def admin_password_file(self) -> Path:
        return self.folder / "admin.password"

    def store_password(self) -> str:
        return self.store_password_file.read_text().strip()

    def admin_password(self) -> str:
        return self.admin_password_file.read_text().strip()

    @property
    def ready(self) -> bool:
        return all(p.exists() for p in (self.ca_pem, self.keystore, self.admin_password_file))


def _secret_file(path: Path, value: str) -> None:
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(value + "\n")


def _keytool(*args: str, stdin: bytes | None = None) -> bytes:
    exe = str(Path(jvm.java()).parent / "keytool")
    proc = subprocess.run([exe, *args], input=stdin, capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise BrokerError(
            f"keytool {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[-400:]}"
        )
    return proc.stdout


def _common(store: str) -> list[str]:
    return ["-storetype", "PKCS12", "-storepass", store, "-keypass", store,
            "-keyalg", "EC", "-groupname", "secp256r1", "-validity", str(VALID_DAYS)]


def make_ca(creds: Credentials, store: str) -> str:
    """A new CA in ``creds.folder``: its key in ``ca.p12`` (returned), its certificate in
    ``ca.pem``."""
    ca = str(creds.folder / "ca.p12")
    _keytool("-genkeypair", "-alias", "ca", "-dname", "CN=substreams embedded CA",
             "-ext", "bc:c", "-keystore", ca, *_common(store))
    creds.ca_pem.write_bytes(
        _keytool("-exportcert", "-rfc", "-alias", "ca", "-keystore", ca, "-storepass", store)
    )
    return ca


def ensure_credentials(home: Path) -> Credentials:
    """The cluster's credentials, made on first use (a restart keeps them: the brokers'
    certificate and the users' SCRAM credentials in the formatted metadata must agree)."""
    creds = Credentials(home / "security")
    if creds.ready:
        return creds
    creds.folder.mkdir(parents=True, exist_ok=True)
    creds.folder.chmod(0o700)
    for stale in creds.folder.iterdir():
        stale.unlink()
    store = secrets.token_urlsafe(18)
    _secret_file(creds.store_password_file, store)
    ca = make_ca(creds, store)
    broker = str(creds.keystore)
    _keytool("-genkeypair", "-alias", "broker", "-dname", "CN=localhost",
             "-keystore", broker, *_common(store))
    request = _keytool("-certreq", "-alias", "broker", "-keystore", broker, "-storepass", store)
    signed = _keytool(
        "-gencert", "-rfc", "-alias", "ca", "-keystore", ca, "-storepass", store,
        "-ext", "SAN=ip:127.0.0.1,dns:localhost", "-ext", "eku=serverAuth,clientAuth",
        "-validity", str(VALID_DAYS), stdin=request,
    )
    # The reply is imported with the CA it chains to (-trustcacerts finds it in the store).
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(creds.ca_pem),
             "-keystore", broker, "-storepass", store, "-storetype", "PKCS12")
    _keytool("-importcert", "-noprompt", "-alias", "broker", "-keystore", broker,
             "-storepass", store, "-storetype", "PKCS12", stdin=signed)
    _secret_file(creds.admin_password_file, secrets.token_urlsafe(18))
    return creds
