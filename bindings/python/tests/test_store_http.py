"""http:// and https:// URLs: shards uploaded through SeaweedFS's S3 gateway and read back through
its WebDAV gateway (the same ``weed mini``, on 127.0.0.1), listed with PROPFIND and read with
ranged GETs, byte-exact, in order and shuffled, over plain HTTP (``allow_http``) and over TLS with
a certificate issued in the test and its authority trusted (``root_certificate``, or
``SSL_CERT_FILE``).

Records hold their own global index in their first element, as in test_store.py; the same shards
are written to local disk, and the two Loaders must agree batch for batch.
"""

import io

import numpy as np
import pytest
from dav_server import CertificateAuthority, SeaweedDav
from s3_server import indexed_records, s3_client

import pinfeed

BUCKET = "pinfeed-http"
SHARDS = 3
PER_SHARD = 600
WIDTH = 29  # uint32 elements a record: 116 bytes
BATCH = 40

pytestmark = pytest.mark.usefixtures("no_launcher_env")


def shard(i):
    return indexed_records(i * PER_SHARD, PER_SHARD, WIDTH, 2246822519)


ALL = np.concatenate([shard(i) for i in range(SHARDS)])


def npy(a):
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    return CertificateAuthority(str(tmp_path_factory.mktemp("tls")))


@pytest.fixture(scope="module", params=["http", "https"])
def server(request, authority):
    """SeaweedFS serving the shards by WebDAV, over plain HTTP and over TLS."""
    up = SeaweedDav(tls=authority if request.param == "https" else None)
    s3 = s3_client(up.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    for i in range(SHARDS):
        s3.put_object(Bucket=BUCKET, Key=f"train/part-{i:03d}.npy", Body=npy(shard(i)))
    s3.put_object(Bucket=BUCKET, Key="train/readme.txt", Body=b"not a shard")
    s3.put_object(Bucket=BUCKET, Key="raw/records.bin", Body=ALL.tobytes())
    yield up
    up.stop()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    for i in range(SHARDS):
        np.save(d / f"part-{i:03d}.npy", shard(i))
    return d


def url(server, key=""):
    return f"{server.dav}/buckets/{BUCKET}/{key}"


def trust(server, authority):
    """The storage options that reach ``server``: plain HTTP allowed, or the test's authority
    trusted as a root."""
    if server.dav.startswith("https"):
        return {"root_certificate": authority.ca}
    return {"allow_http": True}


def loader(server, authority, key, store=None, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("pinned_budget", "256KiB")
    kw.setdefault("num_threads", 2)
    opts = dict(trust(server, authority), **(store or {}))
    return pinfeed.Loader(url(server, key), BATCH, storage_options=opts, **kw)


def batches(it):
    return [np.array(b, copy=True) for b in it]


def test_a_prefix_a_glob_an_object_and_raw_records_read_back_byte_exact(server, authority):
    got = np.concatenate(batches(loader(server, authority, "train/")))
    assert np.array_equal(got, ALL)
    glob = batches(loader(server, authority, "train/part-00[12].npy"))
    assert np.array_equal(np.concatenate(glob), ALL[PER_SHARD:])
    one = batches(loader(server, authority, "train/part-001.npy"))
    assert np.array_equal(np.concatenate(one), ALL[PER_SHARD : 2 * PER_SHARD])
    raw = loader(server, authority, "raw/records.bin", dtype="<u4", shape=[WIDTH])
    assert np.array_equal(np.concatenate(batches(raw)), ALL)


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_shuffled_epochs_equal_the_same_shards_on_local_disk(server, authority, local, shuffle):
    kw = dict(shuffle=shuffle, seed=11)
    if shuffle == "block":
        kw.update(block_size=16, block_window=4)
    remote = loader(server, authority, "train/", **kw)
    here = pinfeed.Loader(str(local), BATCH, device="cpu", pinned_budget="256KiB", **kw)
    for epoch in range(2):
        remote.set_epoch(epoch)
        here.set_epoch(epoch)
        got, want = batches(remote), batches(here)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert np.array_equal(g, w)
        ids = np.concatenate(got)[:, 0]
        assert np.array_equal(np.sort(ids), np.arange(len(ALL)))
        assert np.array_equal(np.concatenate(got), ALL[ids])


def test_stats_count_the_network_and_name_it(server, authority):
    ld = loader(server, authority, "train/")
    batches(ld)
    s = ld.stats()
    net = s["network"]
    assert net["requests"] >= SHARDS and net["retries"] == 0
    assert net["bytes_fetched"] >= ALL.nbytes
    assert net["wait"] > 0
    assert s["reader_description"].startswith(f"object store {server.dav}")


def test_missing_objects_and_empty_prefixes_are_one_line_errors(server, authority):
    cases = {
        "train/absent.npy": url(server, "train/absent.npy"),
        "nothing-here/": ".parquet, .arrow or .jsonl object under this prefix",
        "train/zz-*.npy": "no object matches this pattern",
    }
    for key, words in cases.items():
        with pytest.raises(pinfeed.PinfeedError) as e:
            loader(server, authority, key)
        msg = str(e.value)
        assert words in msg and "\n" not in msg, msg
    with pytest.raises(pinfeed.PinfeedError) as e:
        loader(server, authority, "train/absent.npy")
    assert isinstance(e.value, OSError) and "404" in str(e.value), str(e.value)


def test_an_object_replaced_mid_epoch_is_an_error_not_a_mix_of_versions(server, authority):
    # SeaweedFS's WebDAV ETags have no quotes, so pinfeed compares each response's ETag with
    # the listed one instead of sending If-Match (which Go's server would refuse outright).
    s3 = s3_client(server.endpoint)
    key = "train/part-002.npy"
    ld = loader(server, authority, "train/", pinned_budget="64KiB", prefetch=1)
    it = iter(ld)
    next(it)  # the first shard's records: the third is read much later
    s3.put_object(Bucket=BUCKET, Key=key, Body=npy(shard(2) + 1))  # same size, other bytes
    try:
        with pytest.raises(pinfeed.PinfeedError) as e:
            batches(it)
        msg = str(e.value)
        assert url(server, key) in msg and "the object changed while it was read" in msg, msg
    finally:
        s3.put_object(Bucket=BUCKET, Key=key, Body=npy(shard(2)))


@pytest.fixture(scope="module")
def https_server(authority):
    up = SeaweedDav(tls=authority)
    s3 = s3_client(up.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="train/part-000.npy", Body=npy(shard(0)))
    yield up
    up.stop()


def https_loader(server, key="train/", store=None):
    return pinfeed.Loader(url(server, key), BATCH, device="cpu", storage_options=store)


def test_https_with_an_untrusted_certificate_is_a_one_line_error_naming_the_url(https_server):
    for key in ("train/", "train/part-000.npy"):  # a listing, and one object's HEAD
        with pytest.raises(pinfeed.PinfeedError) as e:
            https_loader(https_server, key)
        msg = str(e.value)
        assert url(https_server, key.rstrip("/")) in msg or url(https_server, key) in msg, msg
        assert "invalid peer certificate" in msg and "root_certificate" in msg, msg
        assert "\n" not in msg, msg


def test_https_trusts_the_authority_through_ssl_cert_file(https_server, authority, monkeypatch):
    monkeypatch.setenv("SSL_CERT_FILE", authority.ca)
    got = batches(https_loader(https_server))
    assert np.array_equal(np.concatenate(got), shard(0))


def test_https_with_invalid_certificates_allowed_reads(https_server):
    got = batches(https_loader(https_server, store={"allow_invalid_certificates": True}))
    assert np.array_equal(np.concatenate(got), shard(0))


def test_http_needs_allow_http():
    plain = SeaweedDav()
    try:
        s3_client(plain.endpoint).create_bucket(Bucket=BUCKET)
        with pytest.raises(pinfeed.PinfeedError) as e:
            pinfeed.Loader(url(plain, "train/"), BATCH, device="cpu")
        msg = str(e.value)
        assert plain.dav in msg and "allow_http=true" in msg and "\n" not in msg, msg
    finally:
        plain.stop()


def test_root_certificate_errors_name_the_file(tmp_path, authority):
    missing = tmp_path / "absent.pem"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    host = "https://127.0.0.1:9/data/"  # refused before any connection is made
    for path, words in ((missing, "cannot read it"), (not_pem, "no PEM certificate")):
        with pytest.raises(pinfeed.PinfeedError) as e:
            pinfeed.Loader(host, BATCH, device="cpu", storage_options={"root_certificate": path})
        msg = str(e.value)
        assert str(path) in msg and words in msg and "\n" not in msg, msg
    with pytest.raises(pinfeed.PinfeedError, match="applies to http\\(s\\):// URLs"):
        pinfeed.Loader(
            "s3://bucket/train/", BATCH, device="cpu", storage_options={"root_certificate": "x"}
        )
