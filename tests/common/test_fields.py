"""`routeopt.common.fields`: the field a misspelt key was meant to be."""

from __future__ import annotations


def test_did_you_mean_walks_models_lists_dicts_and_optionals() -> None:
    """The hint finds the field of the place a misspelt key is in, through list items, dict
    values and Optional fields; nothing when no field is spelt alike or the place is unknown."""
    from pydantic import BaseModel

    from routeopt.common.fields import did_you_mean

    class Inner(BaseModel):
        block_size: int = 1

    class Item(BaseModel):
        max_concurrency: int = 1
        cache: Inner | None = None

    class Top(BaseModel):
        candidates: list[Item] = []
        by_name: dict[str, Inner] = {}

    assert did_you_mean(Top, ("candidates", 0, "max_concurency")) == "; did you mean 'max_concurrency'?"
    assert did_you_mean(Top, ("candidates", 0, "cache", "blok_size")) == "; did you mean 'block_size'?"
    assert did_you_mean(Top, ("by_name", "x", "blocksize")) == "; did you mean 'block_size'?"
    assert did_you_mean(Top, ("candidats",)) == "; did you mean 'candidates'?"
    assert did_you_mean(Top, ("zzz",)) == "" and did_you_mean(Top, ("nope", "x")) == ""
