"""`queue` as text (issue 33): the controller picks the jobs a listing shows and sends each one's kept JSON text,
which the reply line carries as it is; decoded, it is the very objects `queue` sends, picked the same way."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from hsched.controller.api import Api
from hsched.errors import UserError
from hsched.protocol import RESULT_MARK, Preencoded, encode_reply, stamped
from hsched.serialize import pick_jobs
from hsched.testing import Lab

ME = os.getuid()


def item(*command: str, **more: Any) -> dict[str, Any]:
    return {"spec": {"command": list(command), **more}, "source": "<script>"}


async def test_the_text_is_the_objects_picked(tmp_path: Path) -> None:
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        await api.handle("submit_many", {"jobs": [item("a"), item("b", hold=True), item("c", array="0-2")]}, ME)
        everything = await api.handle("queue", {"all": True}, ME)
        first = everything[0]["id"]
        array = next(j["array_id"] for j in everything if j["array_id"] is not None)
        for args in ({}, {"states": ["PENDING"]}, {"ids": [str(first)]}, {"ids": [f"{array}_1"]},
                     {"ids": [str(array)]}, {"users": [everything[0]["user"]]}, {"users": ["nobody"]}):
            got = await api.handle("queue", {**args, "text": True}, ME)
            assert isinstance(got, Preencoded)
            objects = await api.handle("queue", args, ME)
            wanted = pick_jobs(everything, **{k: set(v) for k, v in args.items()})
            assert json.loads(got.text) == objects == wanted, args
        # asked again, the same text (kept, not made afresh), and the reply line carries it after its head
        again = await api.handle("queue", {"text": True}, ME)
        line = encode_reply(stamped({"ok": True, "result": again}))
        assert line.endswith(b"}\n") and line.index(RESULT_MARK) < line.index(b"[")
        assert json.loads(line)["result"] == json.loads(again.text)
        for bad in ({"users": "ann"}, {"ids": [3]}, {"text": "yes"}):
            with pytest.raises(UserError, match=next(iter(bad))):
                await api.handle("queue", bad, ME)


async def test_fields_cut_each_job_after_it_is_picked(tmp_path: Path) -> None:
    """`fields` (the table's: hsched.cli.listing.ROW_FIELDS): each job picked as without them, then only those of
    its object sent (a name it has not is left out); as text, the very cut objects. The filters read the whole
    object, so fields that leave out `user` or `state` still pick by them."""
    async with Lab.open(tmp_path) as lab:
        api = Api(lab.ctl)
        await api.handle("submit_many", {"jobs": [item("a"), item("b", hold=True), item("c", array="0-2")]}, ME)
        everything = await api.handle("queue", {"all": True}, ME)
        user = everything[0]["user"]
        for args in ({}, {"states": ["PENDING"]}, {"users": [user]}, {"users": ["nobody"]},
                     {"ids": [str(everything[1]["id"])]}):
            whole = await api.handle("queue", args, ME)
            for fields in (["id", "name"], ["name", "no_such_field", "id"], []):
                cut = [{k: j[k] for k in fields if k in j} for j in whole]
                assert await api.handle("queue", {**args, "fields": fields}, ME) == cut, (args, fields)
                got = await api.handle("queue", {**args, "fields": fields, "text": True}, ME)
                assert isinstance(got, Preencoded) and json.loads(got.text) == cut, (args, fields)
        # a job changed: its cut changes with it (kept only while its whole object is the very one)
        first = everything[0]["id"]
        ask = {"ids": [str(first)], "fields": ["id", "reason"], "text": True}
        before = json.loads((await api.handle("queue", ask, ME)).text)
        await api.handle("hold", {"id": first}, ME)
        after = json.loads((await api.handle("queue", ask, ME)).text)
        whole = (await api.handle("queue", {"ids": [str(first)]}, ME))[0]
        assert after == [{"id": first, "reason": whole["reason"]}] != before
        with pytest.raises(UserError, match="fields"):
            await api.handle("queue", {"fields": "name"}, ME)
