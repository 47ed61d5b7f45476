"""How the LLM proposers reach their models, read from the worker's environment.

- ``KF_MODELS``: comma-separated litellm model names (``openai/gpt-4o,anthropic/claude-sonnet-4-5``), used
  when the search spec names none. Provider keys come from the provider's usual variable
  (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, …), which litellm reads; they stay in the worker process.
- ``KF_LLM_API_BASE``: one OpenAI-compatible endpoint for every model, e.g. a local vLLM, llama.cpp or
  Ollama server: ``KF_MODELS=openai/qwen2.5-coder KF_LLM_API_BASE=http://127.0.0.1:8000/v1``.
- ``KF_LLM_API_KEY``: the key sent to that endpoint (local servers accept any value, e.g. ``local``).
- ``KF_LLM_MODEL_CONFIG``: per-model settings as JSON, overriding the above:
  ``{"openai/qwen2.5-coder": {"api_base": "http://127.0.0.1:8000/v1", "api_key_env": "LOCAL_KEY",
  "input_usd_per_mtok": 0, "output_usd_per_mtok": 0}}``. Prices are US dollars per million tokens; give
  them for a model litellm has no price for (a local or fine-tuned model): under ``budget.max_llm_usd`` a
  model without a known price is not called, because its spend could not be bounded.
- ``KF_LLM_MAX_TOKENS`` (default 4096), ``KF_LLM_TIMEOUT_S`` (default 120), ``KF_LLM_MAX_ATTEMPTS`` (default
  4), ``KF_LLM_TEMPERATURE`` (default 0.7), ``KF_LLM_CONCURRENCY`` (default 4), ``KF_LLM_BACKOFF_BASE_S``
  (default 1), ``KF_LLM_BACKOFF_MAX_S`` (default 30).

Read through pydantic-settings (``LLMSettings``): a malformed value is a ConfigurationError naming the variable.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.errors import ConfigurationError


class ModelConfig(BaseModel):
    """Settings of one model that override the defaults."""

    model_config = ConfigDict(extra="forbid")

    api_base: str | None = None
    """Endpoint of the model, e.g. a local OpenAI-compatible server `http://127.0.0.1:8000/v1`."""
    api_key_env: str | None = None
    """Name of the environment variable holding its key (the key itself never goes into a config)."""
    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    """Price of a million input tokens in US dollars; None uses litellm's price list."""
    output_usd_per_mtok: float | None = Field(default=None, ge=0)
    """Price of a million output tokens in US dollars; None uses litellm's price list."""


class LLMSettings(BaseSettings):
    """Everything the LLM proposers need besides the search's own spec: the ``KF_LLM_*`` variables and
    ``KF_MODELS`` (``from_env``); arguments given in code take the place of the variables they name."""

    model_config = SettingsConfigDict(
        env_prefix="KF_LLM_", env_ignore_empty=True, extra="ignore", populate_by_name=True
    )

    models: Annotated[list[str], NoDecode] = Field(default_factory=list, validation_alias="KF_MODELS")
    """Default models (KF_MODELS, comma-separated) when the spec names none."""
    api_base: str | None = None
    """Endpoint for every model without its own (KF_LLM_API_BASE)."""
    api_key: str | None = Field(default=None, repr=False)
    """Key for that endpoint (KF_LLM_API_KEY); None lets litellm read the provider's variable."""
    model_configs: Annotated[dict[str, ModelConfig], NoDecode] = Field(
        default_factory=dict, validation_alias="KF_LLM_MODEL_CONFIG"
    )
    """Per-model overrides (KF_LLM_MODEL_CONFIG, JSON)."""
    max_tokens: int = Field(default=4096, ge=64)
    """Most output tokens per reply; also bounds the worst-case cost reserved per call."""
    temperature: float = Field(default=0.7, ge=0, le=2)
    """Sampling temperature."""
    timeout_s: float = Field(default=120.0, gt=0)
    """Seconds one request may take before it is abandoned and retried."""
    max_attempts: int = Field(default=4, ge=1, le=20)
    """Requests per call at most, counting retries after rate limits, timeouts and server errors."""
    backoff_base_s: float = Field(default=1.0, ge=0)
    """First back-off; each retry waits twice as long (with jitter), up to ``backoff_max_s``."""
    backoff_max_s: float = Field(default=30.0, ge=0)
    """Longest back-off between two attempts."""
    concurrency: int = Field(default=4, ge=1, le=64)
    """Requests in flight at once within one proposal round."""

    @field_validator("models", mode="before")
    @classmethod
    def _comma_separated(cls, raw: Any) -> Any:
        return [name.strip() for name in raw.split(",") if name.strip()] if isinstance(raw, str) else raw

    @field_validator("model_configs", mode="before")
    @classmethod
    def _json(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        try:
            return json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"KF_LLM_MODEL_CONFIG is not JSON ({error}): {raw[:200]!r}; expected e.g. "
                '\'{"openai/local": {"api_base": "http://127.0.0.1:8000/v1", "input_usd_per_mtok": 0, '
                '"output_usd_per_mtok": 0}}\''
            ) from None

    @classmethod
    def from_env(cls) -> LLMSettings:
        """Settings from the KF_* variables (see the module docstring); malformed values name the variable."""
        try:
            return cls()
        except ValidationError as error:
            reasons = []
            for item in error.errors():
                # A field read through an alias (KF_MODELS) is reported under it, the others under their name.
                where = str(item["loc"][0]) if item["loc"] else ""
                variable = where if where.upper().startswith("KF_") else f"KF_LLM_{where.upper()}"
                reason = str(item.get("ctx", {}).get("error") or item["msg"])
                if variable in reason:
                    reasons.append(reason)
                elif len(item["loc"]) > 1:  # inside KF_LLM_MODEL_CONFIG's JSON: where, not the value there
                    reasons.append(f"{variable} at {'.'.join(str(part) for part in item['loc'][1:])}: {reason}")
                else:
                    reasons.append(f"{variable}={item['input']!r}: {reason}")
            raise ConfigurationError(f"bad LLM settings in the environment: {'; '.join(reasons)}") from None

    def config_for(self, model: str) -> ModelConfig:
        """The model's own settings (empty when it has none)."""
        return self.model_configs.get(model, ModelConfig())

    def api_base_for(self, model: str) -> str | None:
        """The endpoint to send the model's requests to, or None for the provider's default."""
        return self.config_for(model).api_base or self.api_base

    def api_key_for(self, model: str) -> str | None:
        """The key to send, or None to let litellm read the provider's usual variable."""
        name = self.config_for(model).api_key_env
        if name:
            key = os.environ.get(name)
            if not key:
                raise ConfigurationError(
                    f"model {model!r} takes its key from ${name}, which is not set in the worker's environment"
                )
            return key
        return self.api_key
