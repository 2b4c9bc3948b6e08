import json

from graphrag_spark.index.documents import ReaderOptions, parse_file

OPTS = ReaderOptions(format="auto", text_column="text", title_column="title", max_document_bytes=1000)


def test_text_and_markdown_titles():
    [doc] = parse_file("/c/notes.txt", b"Hello world\r\n", OPTS)
    assert doc["kind"] == "document" and doc["title"] == "notes" and doc["text"] == "Hello world"
    [md] = parse_file("/c/a.md", b"intro\n# The Title\nbody", OPTS)
    assert md["title"] == "The Title"


def test_same_content_gets_the_same_id_whatever_the_line_endings():
    a = parse_file("/a.txt", b"Line one\nLine two", OPTS)[0]
    b = parse_file("/b.txt", b"Line one  \r\nLine two\r\n", OPTS)[0]
    assert a["id"] == b["id"]


def test_bad_inputs_are_rejected_with_reasons():
    cases = {
        "/e.txt": (b"   \n", "empty file"),
        "/bin.txt": (b"\x89PNG\x00\x00\x01", "binary"),
        "/latin.txt": ("café".encode("latin-1"), "not valid UTF-8"),
        "/img.png": (b"data", "unsupported file type"),
        "/big.txt": (b"x" * 2000, "above input.max_document_bytes"),
    }
    for path, (content, reason) in cases.items():
        [row] = parse_file(path, content, OPTS)
        assert row["kind"] == "reject" and reason in row["reason"], (path, row)


def test_jsonl_records_keep_metadata_and_reject_bad_lines():
    lines = [json.dumps({"title": "T1", "text": "first", "lang": "en", "tags": ["a"]}), "{broken", json.dumps({"body": "x"}),
             json.dumps({"text": ""}), ""]
    rows = parse_file("/d.jsonl", "\n".join(lines).encode(), OPTS)
    kinds = [r["kind"] for r in rows]
    assert kinds == ["document", "reject", "reject", "reject"]
    assert rows[0]["title"] == "T1" and rows[0]["metadata"] == {"lang": "en", "tags": '["a"]'}
    assert rows[0]["source"] == "/d.jsonl#L1"
    assert "invalid JSON" in rows[1]["reason"] and "no string field 'text'" in rows[2]["reason"]


def test_csv_needs_the_text_column():
    rows = parse_file("/d.csv", b"title,text\nA,alpha text\nB,beta text\n", OPTS)
    assert [r["title"] for r in rows] == ["A", "B"]
    [header_only] = parse_file("/h.csv", b"title,text\n", OPTS)
    assert header_only["kind"] == "reject" and "no rows" in header_only["reason"]
    [reject] = parse_file("/d.csv", b"name,body\nA,alpha\n", OPTS)
    assert "no column 'text'" in reject["reason"]
