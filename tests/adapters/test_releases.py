"""Release detection that survives real environments (``numcheck.impls.adapters.releases``): one ``.dist-info``
reached through two ``sys.path`` entries or a symlinked folder is one release (pytest's prepend import mode puts
``site-packages`` on the path twice for ``--pyargs``); only distributions of different releases listing the imported
module make it unknown, and that is reported (:func:`release_notes.release_notes`, ``numcheck list``), never silent.
Fake distributions only: nothing here needs a third-party library."""

from __future__ import annotations

import os
from pathlib import Path

from numcheck.impls.adapters import cce, liger, megatron, release_notes, releases, transformer_engine
from numcheck.reports import list_impls

OP = "liger_kernel/ops/fused_linear_cross_entropy.py"


def _fake_dist(site: Path, version: str, files: list[str], name: str = "liger_kernel") -> None:
    """A distribution ``name`` ``version`` installed in ``site``: its ``.dist-info`` (RECORD listing ``files``)
    and the files."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    for f in files:
        (site / f).parent.mkdir(parents=True, exist_ok=True)
        (site / f).write_text("")


def test_one_distribution_on_the_path_twice_and_through_a_symlink_is_one_release(tmp_path, monkeypatch):
    """``site`` on ``sys.path`` twice (as pytest's prepend mode leaves it) and once more through a symlink: one
    liger-kernel distribution, whose release is read (no 'several distributions' ambiguity), for the module reached
    either way."""
    site = tmp_path / "site-packages"
    _fake_dist(site, "0.8.5", [OP, "liger_kernel/__init__.py"])
    link = tmp_path / "lib64"
    os.symlink(site, link)
    for entry in (str(site), str(link), str(site)):
        monkeypatch.syspath_prepend(entry)
    ours = [d for d in releases.distributions("liger-kernel") if releases.root(d) == site.resolve()]
    assert len(ours) == 1, [releases.where(d) for d in ours]
    for module_file in (site / OP, link / OP):
        got = releases.owning_release("liger-kernel", module_file)
        assert got.version == "0.8.5", got  # an installed liger-kernel elsewhere is only named in the note
        assert liger.imported_release(module_file)[0] == "0.8.5"


def test_distributions_of_different_releases_listing_the_module_are_ambiguous(tmp_path, monkeypatch):
    """Two ``.dist-info`` of different releases in one folder (a broken upgrade) both listing the module: the release
    is unknown, and the reason names each release and where it is."""
    site = tmp_path / "site-packages"
    _fake_dist(site, "0.8.4", [OP])
    _fake_dist(site, "0.8.5", [OP])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(site))
    got = releases.owning_release("liger-kernel", site / OP)
    assert got.unknown and "different releases" in got.note, got
    assert f"0.8.4 at {site.resolve()}" in got.note and f"0.8.5 at {site.resolve()}" in got.note, got
    assert liger.imported_release(site / OP)[0] == "unknown"


def test_te_files_with_one_dist_info_reached_twice_give_the_release(tmp_path):
    """TE's reader of a files folder (``NUMCHECK_TE_DIR``) goes through the same helper: one ``.dist-info`` is
    one release, two of different releases listing the Triton file are named as such."""
    folder = tmp_path / "te"
    _fake_dist(folder, "2.7.0", [transformer_engine.FILES["triton"]], name="transformer_engine")
    assert transformer_engine._dist_version_at(folder) == ("2.7.0", None)
    _fake_dist(folder, "2.8.0", [transformer_engine.FILES["triton"]], name="transformer_engine")
    version, why = transformer_engine._dist_version_at(folder)
    assert version is None and "2.7.0 at" in why and "2.8.0 at" in why, why


def test_megatron_release_is_the_imported_ones(tmp_path, monkeypatch):
    """Megatron-core's release is that of the distribution whose files ``import megatron.core`` finds: the same one
    on the path twice is one release; a megatron-core of another release first on the path is not read."""
    core = "megatron/core/__init__.py"
    old, new = tmp_path / "old", tmp_path / "new"
    _fake_dist(old, "0.8.0", ["megatron/other.py"], name="megatron_core")
    _fake_dist(new, "0.16.1", [core], name="megatron_core")
    monkeypatch.setattr(megatron, "_core_file", lambda: new / core)
    for entry in (str(new), str(old), str(new)):
        monkeypatch.syspath_prepend(entry)
    got = megatron.release_info()
    assert got is not None and got.version == "0.16.1", got
    assert megatron.megatron_version() == "0.16.1"


def test_an_unknown_release_is_reported_by_release_notes_and_list(monkeypatch, capsys):
    """An installed library whose release is unknown is in :func:`release_notes.release_notes` (what the report header
    reads) and printed by ``numcheck list``; absent and known releases are not."""
    why = "x.py is listed by liger-kernel distributions of different releases: 0.8.4 at /a, 0.8.5 at /a"
    monkeypatch.setattr(liger, "release_info", lambda: releases.Release(None, why))
    monkeypatch.setattr(transformer_engine, "release_info", lambda: None)
    monkeypatch.setattr(cce, "release_info", lambda: releases.Release("25.1.1"))
    monkeypatch.setattr(megatron, "release_info", lambda: None)
    assert release_notes.release_notes() == {"liger-kernel": why}
    list_impls.print_release_notes()
    out = capsys.readouterr().out
    assert "liger-kernel" in out and why in out and "release unknown" in out, out
