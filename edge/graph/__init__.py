"""ONNX graph tools used on the build host: reading a model, freezing inputs, lowering ops a converter
mistranslates, precision recipes, the op-support checks per chain, and the demo model builders.
"""
