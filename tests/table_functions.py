"""Python table functions (Spark UDTFs) that the tests' jobs name as `table_functions:<name>`."""

from __future__ import annotations

from pyspark.sql.functions import udtf


@udtf(returnType="word: string, position: int")
class split_words:
    """Flink's table_func: one row per word of a text, with its place (none for NULL or blank)."""

    def eval(self, text: str | None):
        for position, word in enumerate((text or "").split()):
            yield word, position


@udtf(returnType="word: string")
class shout:
    """A function that fails on purpose for one input, to show how a failing call is reported."""

    def eval(self, text: str | None):
        if text == "boom":
            raise ValueError("no shouting at boom")
        yield (text or "").upper()


class not_a_udtf:
    def eval(self, text):
        yield (text,)


@udtf(returnType="word: string")
class with_terminate:
    def eval(self, text):
        yield (text,)

    def terminate(self):
        yield ("end",)
