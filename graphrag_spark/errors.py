"""Errors a user can act on: printed as one sentence, never as a stack trace."""


class UserError(Exception):
    """A mistake in input or configuration that the user fixes (bad path, bad config, unreadable data)."""


class StageFailed(Exception):
    """A stage ran but its failure share crossed the configured threshold; the message is the summary."""
