"""The local OpenAI-compatible server: HTTP shapes, limits and faults, and meaningful answers to every prompt."""

import base64
import concurrent.futures
import json
import math
import os
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.client import RemoteDisconnected
from pathlib import Path

import pytest

from graphrag_spark.index.extract_llm import ExtractionPrompts, parse_claims, parse_extraction
from graphrag_spark.llm.server import MARKERS, answer, classify, embed_text, start_server
from graphrag_spark.prompts import DEFAULT_PROMPT_DIR, load_prompt

NEOCHIP_TEXT = (
    "NeoChip's (NC) shares surged in their first week of trading on the NewTech Exchange. However, market analysts "
    "caution that the chipmaker's public debut may not reflect trends for other technology IPOs. NeoChip, previously "
    "a private entity, was acquired by Quantum Systems in 2016. The innovative semiconductor firm specializes in "
    "low-power processors for wearables and IoT devices."
)
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def server():
    with start_server() as handle:
        yield handle


def post(url, body, timeout=10):
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def chat(server, content, **params):
    status, _, body = post(
        f"{server.base_url}/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": content}], **params},
    )
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def extraction_prompt(text=NEOCHIP_TEXT):
    prompts = ExtractionPrompts.load()
    return prompts, prompts.extraction.render(
        entity_types="organization, person, geo, event", examples=prompts.examples.text, input_text=text
    )


def test_each_prompt_file_carries_exactly_its_own_marker():
    files = {p.stem: p.read_text(encoding="utf-8") for p in DEFAULT_PROMPT_DIR.glob("*.txt")}
    for kind, marker in MARKERS.items():
        assert [name for name, text in files.items() if marker in text] == [kind]


def test_chat_response_has_the_openai_shape(server):
    status, _, body = post(
        f"{server.base_url}/chat/completions",
        {"model": "gpt-x", "messages": [{"role": "user", "content": "Hello there. Bye."}]},
    )
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == "gpt-x" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0 and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_max_tokens_truncates_with_finish_reason_length(server):
    _, prompt = extraction_prompt()
    status, _, body = post(
        f"{server.base_url}/chat/completions",
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": prompt}]},
    )
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"


def ask(server, messages):
    status, _, body = post(f"{server.base_url}/chat/completions", {"model": "m", "messages": messages})
    assert status == 200, body
    return body["choices"][0]["message"]["content"]


def test_extraction_and_gleaning_are_derived_from_the_text(server):
    prompts, prompt = extraction_prompt()
    first = ask(server, [{"role": "user", "content": prompt}])
    history = [{"role": "user", "content": prompt}, {"role": "assistant", "content": first}]
    check = [{"role": "user", "content": prompts.loop_check.text}]
    assert classify(history + check) == "gleaning_loop_check"
    assert ask(server, history + check) == "Y"  # some entities are held back for the gleaning round
    history += check + [{"role": "assistant", "content": "Y"}, {"role": "user", "content": prompts.continuation.text}]
    more = ask(server, history)
    assert ask(server, history + [{"role": "assistant", "content": more}] + check) == "N"

    parsed, gleaned = parse_extraction(first), parse_extraction(more)
    assert parsed.rejected == gleaned.rejected == 0
    first_names, gleaned_names = {e["name"] for e in parsed.entities}, {e["name"] for e in gleaned.entities}
    assert gleaned_names and not first_names & gleaned_names
    assert first_names | gleaned_names == {
        "NEOCHIP",
        "NC",
        "NEWTECH EXCHANGE",
        "IPOS",
        "QUANTUM SYSTEMS",
        "IOT",
    }  # not HOWEVER
    owner = next(
        r
        for r in parsed.relationships + gleaned.relationships
        if {r["source"], r["target"]} == {"NEOCHIP", "QUANTUM SYSTEMS"}
    )
    assert "acquired by Quantum Systems in 2016" in owner["description"]


def test_claims_answer_has_one_claim_per_related_pair(server):
    prompt = load_prompt("claims_extraction").render(
        claim_description="Any claim", entity_specs="NEOCHIP", input_text=NEOCHIP_TEXT
    )
    claims = parse_claims(chat(server, prompt))
    acquisition = next(c for c in claims.claims if c["object"] == "QUANTUM SYSTEMS")
    assert (acquisition["subject"], acquisition["start_date"], acquisition["end_date"]) == (
        "NEOCHIP",
        "2016-01-01",
        "2016-12-31",
    )
    assert claims.rejected == 0


COMMUNITY_CONTEXT = """-----Entities-----
id,entity,description
1,NEOCHIP,"NeoChip makes low-power processors, for wearables."
2,QUANTUM SYSTEMS,Quantum Systems owned NeoChip.
3,NEWTECH EXCHANGE,A stock exchange.
4,NC,Ticker of NeoChip.
5,IOT,Internet of things.
6,WEARABLES,Devices.
-----Relationships-----
id,source,target,description,combined_degree
10,QUANTUM SYSTEMS,NEOCHIP,Quantum Systems acquired NeoChip in 2016.,5
11,NEOCHIP,NEWTECH EXCHANGE,NeoChip trades on the NewTech Exchange.,4
-----Claims-----
id,entity,type,status,description
20,QUANTUM SYSTEMS,ACQUISITION,TRUE,Acquired NeoChip in 2016.
-----Reports-----
id,title,content
30,Chip makers,A sub-community of chip makers.
"""


def test_community_report_is_json_citing_the_context_ids(server):
    prompt = load_prompt("community_report").render(input_text=COMMUNITY_CONTEXT)
    report = json.loads(chat(server, prompt, response_format={"type": "json_object"}))
    assert set(report) == {"title", "summary", "rating", "rating_explanation", "findings"}
    assert "NEOCHIP" in report["title"] and 0 <= report["rating"] <= 10
    text = json.dumps(report)
    assert "Entities (1, 2, 3, 4, 5, +more)" in text  # at most five ids, then +more
    assert "Entities (2, 1), Relationships (10)" in text
    assert "Claims (20)" in text and "Claim about QUANTUM SYSTEMS: ACQUISITION" in text and "Reports (30)" in text


def test_global_map_scores_by_overlap_and_cites_report_ids(server):
    context = "-----Reports-----\nid,title,content\n7,Chips,NeoChip sells processors for wearables.\n9,Ports,The harbour of Vell closed."
    prompt = load_prompt("global_map")

    def render(**values):
        return prompt.render(kind="Reports", units="community reports", **values)

    points = json.loads(chat(server, render(question="Who sells processors?", context_data=context)))["points"]
    assert points == [{"description": "NeoChip sells processors for wearables. [Data: Reports (7)]", "score": 100}]
    points = json.loads(chat(server, render(question="Quantum entanglement?", context_data=context)))["points"]
    assert [p["score"] for p in points] == [0]


def test_reduce_keeps_citations_and_admits_ignorance(server):
    prompt = load_prompt("global_reduce")

    def render(**values):
        return prompt.render(kind="Reports", **values)

    data = "----Analyst 1----\nImportance Score: 80\nNeoChip sells processors. [Data: Reports (7, 8)]"
    answer = chat(server, render(question="Who sells?", report_data=data, response_type="a list"))
    assert "NeoChip sells processors. [Data: Reports (7, 8)]" in answer and "Analyst" not in answer
    assert "do not know" in chat(server, render(question="Who sells?", report_data="", response_type="a list"))


def test_summaries_are_extractive(server):
    raptor = chat(server, load_prompt("raptor_summary").render(context=NEOCHIP_TEXT))
    assert raptor.startswith("NeoChip's (NC) shares surged") and raptor.split(". ")[0] in NEOCHIP_TEXT
    merged = chat(
        server,
        load_prompt("summarize_descriptions").render(
            entity_name="NEOCHIP", description_list="- Makes chips.\n- Went public.\n- Makes chips.", max_words=50
        ),
    )
    assert merged == "Makes chips. Went public."
    basic = chat(
        server,
        load_prompt("basic_search").render(
            question="Who acquired NeoChip?", context_data=NEOCHIP_TEXT, response_type="prose"
        ),
    )
    assert "acquired by Quantum Systems" in basic and "[Data: Sources (0)]" in basic


def test_embeddings_are_deterministic_unit_vectors_with_similarity(server):
    status, _, body = post(
        f"{server.base_url}/embeddings",
        {"model": "e", "input": ["chip maker NeoChip", "chip makers NeoChip", "harbour closed"]},
    )
    vectors = [d["embedding"] for d in body["data"]]
    assert status == 200 and body["usage"]["prompt_tokens"] > 0 and len(vectors[0]) == 384
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
    assert math.isclose(dot(vectors[0], vectors[0]), 1.0, rel_tol=1e-9)
    assert dot(vectors[0], vectors[1]) > 0.8 > 0.3 > dot(vectors[0], vectors[2])
    assert vectors[0] == embed_text("chip maker NeoChip")
    _, _, encoded = post(
        f"{server.base_url}/embeddings", {"model": "e", "input": "chip maker NeoChip", "encoding_format": "base64"}
    )
    decoded = struct.unpack("<384f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert max(abs(a - b) for a, b in zip(decoded, vectors[0])) < 1e-6


def test_stats_and_reset_over_http(server):
    chat(server, "One.")
    chat(server, "One.")
    with urllib.request.urlopen(f"{server.base_url}/stats") as response:
        stats = json.loads(response.read())
    assert stats["served"]["chat"] == 2 and stats["by_kind"] == {"unknown": 2}
    assert list(stats["served_hashes"].values()) == [2]  # the same request twice shows as a repeat
    post(server.base_url.replace("/v1", "/reset"), {})
    assert server.stats()["served"]["chat"] == 0 and server.stats()["request_hashes"] == {}


def test_fifty_concurrent_connections_are_all_served():
    with start_server(latency_s=0.3) as handle:
        with concurrent.futures.ThreadPoolExecutor(50) as pool:
            statuses = list(
                pool.map(
                    lambda i: post(
                        f"{handle.base_url}/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": f"Text {i}."}]},
                    )[0],
                    range(50),
                )
            )
        assert statuses == [200] * 50 and handle.stats()["served"]["chat"] == 50


def test_held_answers_wait_for_the_end_of_the_hold_and_stopping_releases_them():
    with start_server() as handle, concurrent.futures.ThreadPoolExecutor(3) as pool:
        body = {"model": "m", "messages": [{"role": "user", "content": "Text."}]}
        with handle.holding_answers():
            held = pool.submit(post, f"{handle.base_url}/chat/completions", body)
            with pytest.raises(concurrent.futures.TimeoutError):
                held.result(timeout=1.0)
            assert handle.stats()["requests"]["chat"] == 1 and handle.stats()["served"]["chat"] == 0
            assert list(handle.requests_in_progress().values()) == ["unknown"]
        assert held.result(timeout=10)[0] == 200 and handle.stats()["served"]["chat"] == 1
        assert handle.requests_in_progress() == {} and handle.stats()["repaid"] == {"chat": 0, "embeddings": 0}
        assert post(f"{handle.base_url}/chat/completions", body)[0] == 200  # the same request, answered again
        assert handle.stats()["repaid"] == {"chat": 1, "embeddings": 0}
        with handle.holding_answers():
            stranded = pool.submit(post, f"{handle.base_url}/chat/completions", body)
            while not handle.requests_in_progress():
                time.sleep(0.01)
            handle.stop()  # a stopping server answers what it holds rather than hang its threads
            assert stranded.result(timeout=10)[0] == 200


def test_request_limit_answers_429_with_retry_after():
    with start_server(requests_per_minute=120, window_s=1.0) as handle:  # 2 requests per 1-s window
        codes = [
            post(
                f"{handle.base_url}/chat/completions",
                {"model": "m", "messages": [{"role": "user", "content": f"T{i}."}]},
            )
            for i in range(3)
        ]
        assert [c[0] for c in codes] == [200, 200, 429]
        headers = {k.lower(): v for k, v in codes[2][1].items()}
        assert headers["retry-after"] == "1" and 0 < int(headers["retry-after-ms"]) <= 1000
        assert codes[2][2]["error"]["code"] == "rate_limit_exceeded" and handle.stats()["rate_limited"] == 1
        assert handle.stats()["busiest_window"]["requests"] == 2, "the fullest window: what was admitted"


def test_token_limit_answers_429():
    with start_server(tokens_per_minute=600, window_s=60) as handle:
        _, prompt = extraction_prompt()  # well over 600 tokens with its answer
        first = post(
            f"{handle.base_url}/chat/completions", {"model": "m", "messages": [{"role": "user", "content": prompt}]}
        )
        second = post(
            f"{handle.base_url}/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Short."}]}
        )
        assert (first[0], second[0]) == (200, 429)
        usage = first[2]["usage"]
        assert handle.stats()["busiest_window"]["tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_injected_faults_are_counted():
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello."}]}
    with start_server(error_rate=1.0) as handle:
        assert post(f"{handle.base_url}/chat/completions", body)[0] == 500
        assert handle.stats()["injected"]["500"] == 1
    with start_server(timeout_rate=1.0) as handle:
        with pytest.raises((RemoteDisconnected, ConnectionError, urllib.error.URLError)):
            post(f"{handle.base_url}/chat/completions", body)
        assert handle.stats()["injected"]["timeout"] == 1 and handle.stats()["served"]["chat"] == 0
    _, prompt = extraction_prompt()
    with start_server(malformed_rate=1.0) as handle:
        outputs = {chat(handle, prompt + str(i)) for i in range(6)}
        assert not any(o.endswith("<|COMPLETE|>") for o in outputs)
        assert handle.stats()["injected"]["malformed"] == 6


def test_same_seed_same_answers_and_faults():
    bodies = [{"model": "m", "messages": [{"role": "user", "content": f"Sentence number {i}."}]} for i in range(20)]
    runs = []
    for _ in range(2):
        with start_server(error_rate=0.3, seed=7) as handle:
            runs.append([post(f"{handle.base_url}/chat/completions", b)[0] for b in bodies])
    assert runs[0] == runs[1] and 500 in runs[0] and 200 in runs[0]


def test_command_line_prints_its_url_and_serves():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "graphrag_spark.llm.server", "--port", "0", "--latency", "0.01"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as response:
            assert json.loads(response.read())["served"]["chat"] == 0
    finally:
        process.terminate()
        process.wait(timeout=10)


# microsoft/graphrag's prompts, as its indexer sends them (only the parts the server reads), so the
# side-by-side benchmark can run it against this server.
GRAPHRAG_EXTRACTION = (
    "-Goal-\nGiven a text document that is potentially relevant to this activity and a list of entity types, "
    "identify all entities of those types from the text and all relationships among the identified entities.\n"
    "######################\n-Real Data-\n######################\nEntity_types: organization,person\n"
    f"Text: {NEOCHIP_TEXT}\n######################\nOutput:"
)
GRAPHRAG_CONTINUE = ("MANY entities and relationships were missed in the last extraction. Remember to ONLY emit "
                     "entities that match any of the previously extracted types. Add them below using the same format:\n")
GRAPHRAG_LOOP = ("It appears some entities and relationships may have still been missed. Answer Y if there are still "
                 "entities or relationships that need to be added, or N if there are none. Please answer with a "
                 "single letter Y or N.\n")


def test_graphrag_extraction_and_its_gleaning_are_answered_in_its_format(server):
    history = [{"role": "user", "content": GRAPHRAG_EXTRACTION}]
    first = ask(server, history)
    history += [{"role": "assistant", "content": first}, {"role": "user", "content": GRAPHRAG_CONTINUE}]
    more = ask(server, history)
    loop = ask(server, history + [{"role": "assistant", "content": more}, {"role": "user", "content": GRAPHRAG_LOOP}])
    parsed, gleaned = parse_extraction(first), parse_extraction(more)
    names = {e["name"] for e in parsed.entities} | {e["name"] for e in gleaned.entities}
    assert {"NEOCHIP", "QUANTUM SYSTEMS"} <= names and gleaned.entities and loop == "N"
    assert {e["type"] for e in parsed.entities} <= {"ORGANIZATION", "PERSON"}


def test_graphrag_summary_and_report_prompts_are_answered():
    summary_prompt = ("You are a helpful assistant responsible for generating a comprehensive summary of the data "
                      "provided below.\nLimit the final description length to 12 words.\n\n#######\n-Data-\n"
                      'Entities: "NEOCHIP"\nDescription List: ["NeoChip makes processors.", "NeoChip was acquired '
                      'by Quantum Systems in 2016."]\n#######\nOutput:\n')
    kind, text = answer([{"role": "user", "content": summary_prompt}])
    assert kind == "summarize_descriptions" and text.startswith("NeoChip makes processors.")
    report_prompt = ("# Goal\nWrite a comprehensive report of a community, given a list of entities.\n"
                     "# Real Data\n\nUse the following text for your answer.\n\nText:\n-----Entities-----\n"
                     "human_readable_id,title,description,degree\n1,NEOCHIP,A chipmaker,2\n2,QUANTUM SYSTEMS,A buyer,1\n"
                     "-----Relationships-----\nhuman_readable_id,source,target,description,combined_degree\n"
                     "7,NEOCHIP,QUANTUM SYSTEMS,Quantum Systems acquired NeoChip,3\n\n"
                     "The report should include the following sections:\n")
    kind, text = answer([{"role": "user", "content": report_prompt}])
    report = json.loads(text)
    assert kind == "community_report" and report["title"] == "NEOCHIP and QUANTUM SYSTEMS"
    assert "Relationships (7)" in json.dumps(report["findings"])
