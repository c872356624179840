"""Reading a request to route: the prompt of every OpenAI body shape, and a clear error otherwise."""

from __future__ import annotations

import pytest

from routeopt.artifacts.serving.route_request import BadRequest, RouteRequest, messages_text, route_request


def test_prompt_and_messages_give_the_text_routeopt_trains_on() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Sort "},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "3 1 2"},
            ],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": ""},
    ]
    assert messages_text(messages) == "Be brief.\nSort 3 1 2"
    assert route_request({"messages": messages}).prompt == "Be brief.\nSort 3 1 2"
    assert route_request({"prompt": ["a", "b"]}).prompt == "a\nb"
    assert route_request({"prompt": ""}).prompt == ""  # an empty prompt is a prompt


def test_suite_request_id_and_target_come_from_body_then_metadata_then_headers() -> None:
    headers = {"x-routeopt-suite": "h", "x-request-id": "hid", "x-routeopt-quality-target": "0.5"}
    assert route_request({"prompt": "p"}, headers) == RouteRequest("p", "h", "hid", 0.5)
    meta = {"routeopt_suite": "m", "routeopt_request_id": "mid", "routeopt_quality_target": 0.7}
    assert route_request({"prompt": "p", "metadata": meta}, headers) == RouteRequest("p", "m", "mid", 0.7)
    body = {"prompt": "p", "suite": "b", "request_id": "bid", "quality_target": 0, "metadata": meta}
    assert route_request(body, headers) == RouteRequest("p", "b", "bid", 0.0)
    assert route_request({"prompt": "p"}) == RouteRequest("p")


def test_a_body_naming_another_model_passes_through() -> None:
    assert route_request({"model": "gpt-4o", "messages": "not even valid"}).passthrough == "gpt-4o"
    assert route_request({"model": "routeopt", "prompt": "p"}).passthrough is None
    assert route_request({"model": "mine", "prompt": "p"}, alias="mine").passthrough is None


@pytest.mark.parametrize(
    "body, message",
    [
        ([1, 2], "the body is a JSON list, not an object"),
        ({}, "no prompt"),
        ({"prompt": "a", "messages": []}, "not both"),
        ({"prompt": 3}, "prompt is a int"),
        ({"prompt": ["a", 1]}, "prompt is a list"),
        ({"messages": []}, "messages is empty"),
        ({"messages": "hi"}, "messages is a str, not a list"),
        ({"messages": [1]}, r"messages\[0\] is a int, not an object"),
        ({"messages": [{"content": 7}]}, r"messages\[0\].content is a int"),
        ({"messages": [{"content": ["x"]}]}, r"messages\[0\].content\[0\] is a str"),
        ({"messages": [{"content": [{"text": 5}]}]}, r"messages\[0\].content\[0\].text is a int"),
        ({"prompt": "p", "suite": 5}, "suite is a int"),
        ({"prompt": "p", "metadata": {"routeopt_suite": ["s"]}}, "metadata.routeopt_suite is a list"),
        ({"prompt": "p", "request_id": "x" * 300}, "request_id must be at most 256 printable"),
        ({"prompt": "p", "request_id": "a\r\nb"}, "request_id must be at most 256 printable"),
        ({"prompt": "p", "quality_target": "high"}, "quality_target is 'high', not a number"),
        ({"prompt": "p", "quality_target": float("nan")}, "finite number >= 0"),
        ({"prompt": "p", "quality_target": -1}, "finite number >= 0"),
        ({"prompt": "p", "quality_target": True}, "boolean"),
        ({"prompt": "p", "model": 5}, "model is a int"),
    ],
)
def test_malformed_requests_name_the_field(body, message) -> None:
    with pytest.raises(BadRequest, match=message):
        route_request(body)


def test_a_bad_header_is_named_too() -> None:
    with pytest.raises(BadRequest, match="header x-routeopt-quality-target"):
        route_request({"prompt": "p"}, {"x-routeopt-quality-target": "inf"})
