"""Integrations of warpattn with other libraries, each imported on its own (importing this package
imports none of them): warpattn.integrations.transformers registers warpattn as an attention
implementation of Hugging Face transformers."""
