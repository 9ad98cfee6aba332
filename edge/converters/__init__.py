"""Converters: one module per backend, registered by name through entry points."""

from edge.converters.base import CONVERTERS, ConversionRequest, ConversionResult, Converter

__all__ = ["CONVERTERS", "ConversionRequest", "ConversionResult", "Converter"]
