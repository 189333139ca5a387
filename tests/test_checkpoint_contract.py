"""The checkpoint contract: one canonical bundle with a stable schema, strict on the way in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from maka_core.checkpoints import (
    CHECKPOINT_BUNDLE_SCHEMA,
    Checkpoint,
    CheckpointBundle,
    CheckpointPolicy,
    NoCheckpoint,
    WorkspaceBoundary,
)
from maka_core.errors import CheckpointError

RUNTIME = {
    "workspace_identity": "workspace:v1:6f1d2c1e-8a86-4a43-9f59-2b1f5f0c7a10",
    "workspace_epoch": 0,
    "immutable_runtime_high_water": 12,
    "immutable_runtime_digest": "sha256:" + "ab" * 32,
}
CHECKPOINT = Checkpoint(
    ref="refs/maka/checkpoints/s-1/1", commit="c" * 40, tree="d" * 40, file_count=3, byte_count=42
)

#: The frozen wire form: a change here is a schema change (a new schema id, not an edit).
GOLDEN = (
    '{"boundary":{"checkpointPolicyHash":"sha256:' + CheckpointPolicy().policy_hash()[7:] + '",'
    '"checkpointRef":"refs/maka/checkpoints/s-1/1",'
    '"immutableRuntimeDigest":"sha256:' + "ab" * 32 + '","immutableRuntimeHighWater":12,"workspaceEpoch":0,'
    '"workspaceIdentity":"workspace:v1:6f1d2c1e-8a86-4a43-9f59-2b1f5f0c7a10"},'
    '"checkpoint":{"byteCount":42,"carrier":"git","commit":"' + "c" * 40 + '","fileCount":3,'
    '"ref":"refs/maka/checkpoints/s-1/1","tree":"' + "d" * 40 + '"},'
    '"schema":"maka.workspace_checkpoint/v1"}'
)


def test_the_bundle_is_one_canonical_text_with_a_stable_schema() -> None:
    bundle = CheckpointBundle.of(RUNTIME, CHECKPOINT, CheckpointPolicy())
    assert bundle.encode() == GOLDEN
    assert CheckpointBundle.decode(GOLDEN) == bundle and CheckpointBundle.decode(GOLDEN.encode()) == bundle
    assert (
        bundle.digest().startswith("sha256:") and bundle.digest() == CheckpointBundle.decode(GOLDEN).digest()
    )
    assert json.loads(GOLDEN)["schema"] == CHECKPOINT_BUNDLE_SCHEMA
    # The policy hash pins the policy: another size limit is another hash.
    assert CheckpointPolicy(max_files=10).policy_hash() != CheckpointPolicy().policy_hash()
    assert CheckpointPolicy().policy_hash() == CheckpointPolicy().policy_hash()


def test_a_workspace_without_a_checkpoint_says_why_and_has_no_ref() -> None:
    bundle = CheckpointBundle.of(RUNTIME, NoCheckpoint(code="workspace_not_git"), CheckpointPolicy())
    wire = json.loads(bundle.encode())
    assert "checkpointRef" not in wire["boundary"] and "checkpoint" not in wire
    assert wire["noCheckpoint"] == {"code": "workspace_not_git", "detail": ""}
    assert CheckpointBundle.decode(bundle.encode()) == bundle


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda w: w.update(schema="maka.workspace_checkpoint/v2"), "checkpoint_bundle_invalid"),
        (
            lambda w: w["boundary"].update(checkpointRef="refs/maka/checkpoints/s-1/2"),
            "checkpoint_bundle_invalid",
        ),
        (
            lambda w: w.update(noCheckpoint={"code": "workspace_not_git", "detail": ""}),
            "checkpoint_bundle_invalid",
        ),
        (lambda w: w["boundary"].update(workspaceEpoch=-1), "checkpoint_bundle_invalid"),
        (lambda w: w["boundary"].update(workspaceEpoch="0"), "checkpoint_bundle_invalid"),
        (lambda w: w["boundary"].update(immutableRuntimeDigest="sha256:xyz"), "checkpoint_bundle_invalid"),
        (lambda w: w["checkpoint"].update(carrier="svn"), "checkpoint_bundle_invalid"),
        (lambda w: w["checkpoint"].update(extra=1), "checkpoint_bundle_invalid"),
        (lambda w: w["boundary"].update(checkpointRef=None), "checkpoint_bundle_invalid"),
    ],
)
def test_a_stored_bundle_of_another_shape_is_refused(mutate, code: str) -> None:
    wire = json.loads(GOLDEN)
    mutate(wire)
    with pytest.raises(CheckpointError) as refused:
        CheckpointBundle.decode(json.dumps(wire))
    assert refused.value.code == code


def test_the_same_value_in_other_bytes_is_refused() -> None:
    for text in (
        json.dumps(json.loads(GOLDEN), indent=1),
        GOLDEN + " ",
        "not json",
        '{"schema":1,"schema":2}',
    ):
        with pytest.raises(CheckpointError) as refused:
            CheckpointBundle.decode(text)
        assert refused.value.code in ("checkpoint_bundle_not_canonical", "checkpoint_bundle_invalid")
    with pytest.raises(CheckpointError) as refused:
        CheckpointBundle.decode(json.dumps(json.loads(GOLDEN), indent=1))
    assert refused.value.code == "checkpoint_bundle_not_canonical"


def test_models_are_frozen_facts() -> None:
    boundary = CheckpointBundle.of(RUNTIME, CHECKPOINT, CheckpointPolicy()).boundary
    with pytest.raises(ValidationError):
        boundary.workspace_epoch = 1  # type: ignore[misc]
    assert isinstance(boundary, WorkspaceBoundary)


def test_the_checkpoints_package_does_not_import_temporalio() -> None:
    probe = "import sys, maka_core.checkpoints; print([m for m in sys.modules if 'temporalio' in m])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "field, value",
    [
        ("commit", "--output=x"),
        ("tree", "--output=x"),
        ("commit", "C" * 40),  # not lowercase hex: git would read it, but not as the id it names
        ("tree", "d" * 39),
        ("tree", "HEAD^{tree}"),  # a revision expression is no object id
        ("ref", "--output=x"),
        ("ref", "refs/heads/main"),  # a user's ref: never a checkpoint's
        ("ref", "refs/maka/checkpoints/s-1/1 --output=x"),
        ("ref", "refs/maka/checkpoints/s-1/../1"),
    ],
)
def test_an_imported_bundle_cannot_pass_an_option_or_foreign_name_to_git(
    field: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    wire = json.loads(GOLDEN)
    wire["checkpoint"][field] = value
    if field == "ref":
        wire["boundary"]["checkpointRef"] = value  # consistent, so only the name itself is at fault
    with pytest.raises(CheckpointError) as refused:
        CheckpointBundle.decode(json.dumps(wire, separators=(",", ":"), sort_keys=True))
    assert refused.value.code == "checkpoint_bundle_invalid"
    with pytest.raises(ValidationError):
        Checkpoint(**{**CHECKPOINT.model_dump(), field: value})
    assert list(tmp_path.iterdir()) == []  # nothing written
