"""The offline (extractive) RAPTOR summary."""

from graphrag_spark.raptor.summaries import extractive_summary


def words(text: str) -> int:
    return len(text.split())


CLUSTER = [
    "Scrooge counted his money in the cold counting-house. The clerk shivered by a tiny fire.",
    "Scrooge refused to give money to the gentlemen collecting for the poor. It was Christmas Eve.",
    "The clerk asked Scrooge for Christmas Day off. Scrooge grumbled about paying a day's wages for no work.",
    "A parrot lived on a distant island.",
]


def test_summary_keeps_the_central_sentences_in_reading_order_within_budget():
    summary = extractive_summary(CLUSTER, 30, words)
    assert words(summary) <= 30
    assert "parrot" not in summary  # off-topic sentence shares no vocabulary with the rest
    assert "Scrooge" in summary
    kept = [s for text in CLUSTER for s in text.split(". ") if s.rstrip(".") in summary]
    assert summary.index(kept[0].rstrip(".")) < summary.index(kept[-1].rstrip("."))


def test_a_sentence_that_would_overflow_is_skipped_for_a_shorter_one():
    texts = ["Scrooge Scrooge Scrooge money money clerk clerk clerk fire. Scrooge money.", "Scrooge money clerk."]
    summary = extractive_summary(texts, 6, words)
    assert summary == "Scrooge money. Scrooge money clerk."


def test_budget_below_every_sentence_keeps_the_head_of_the_most_central_one():
    summary = extractive_summary(["Scrooge counted money, and the clerk watched Scrooge count money."], 4, words)
    assert summary == "Scrooge counted money, and"


def test_no_text_gives_an_empty_summary():
    assert extractive_summary(["", "  "], 50, words) == ""
    assert extractive_summary(["The and of."], 50, words) == "The and of."
