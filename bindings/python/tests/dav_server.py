"""SeaweedFS's WebDAV gateway on 127.0.0.1, for the http(s):// tests: the same ``weed mini``
as the S3 tests (:class:`s3_server.Seaweed`), its WebDAV port opened too, optionally over TLS
with a certificate issued in the test by a throwaway certificate authority (``trustme``).

Objects uploaded to bucket ``B`` through the S3 gateway are the WebDAV server's files under
``/buckets/B/``, so one upload serves both.
"""

import os
import socket
import time

from s3_server import HOST, Seaweed, free_port


class CertificateAuthority:
    """A certificate authority made for one test run, and a server certificate it issued for
    127.0.0.1, written as PEM files under ``folder``: ``ca`` (the root to trust), ``cert`` (the
    server's chain) and ``key``."""

    def __init__(self, folder):
        import trustme

        authority = trustme.CA()
        issued = authority.issue_cert(HOST, "localhost")
        self.ca = os.path.join(folder, "ca.pem")
        self.cert = os.path.join(folder, "server.pem")
        self.key = os.path.join(folder, "server.key")
        authority.cert_pem.write_to_path(self.ca)
        issued.private_key_pem.write_to_path(self.key)
        with open(self.cert, "wb") as f:
            for blob in issued.cert_chain_pems:
                f.write(blob.bytes())


class SeaweedDav(Seaweed):
    """``weed mini`` with its WebDAV gateway on a free loopback port (over TLS when ``tls`` is
    a :class:`CertificateAuthority`), anonymous: WebDAV reads are not signed."""

    name = "weed mini (WebDAV)"

    def __init__(self, tls=None):
        self.tls = tls
        self.dav_port = free_port()
        super().__init__(anonymous=True, taken={self.dav_port})

    @property
    def dav(self) -> str:
        """The WebDAV server's base URL: files of bucket B are under ``{dav}/buckets/B/``."""
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.dav_port}"

    def webdav(self):
        flags = [f"-webdav.port={self.dav_port}"]
        if self.tls:
            flags += [f"-webdav.cert.file={self.tls.cert}", f"-webdav.key.file={self.tls.key}"]
        return flags

    def start(self):
        super().start()  # the S3 gateway answers; the WebDAV one may start a moment later
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((HOST, self.dav_port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: no WebDAV server on {self.dav}") from None
                time.sleep(0.1)
