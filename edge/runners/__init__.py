"""Runners: one module per runtime, registered by name through entry points."""

from edge.runners.base import RUNNERS, Runner, RunnerInfo

__all__ = ["RUNNERS", "Runner", "RunnerInfo"]
