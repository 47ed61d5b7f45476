"""The search's domain: what a user asks for (SearchSpec), what a search carries (SearchState), the
candidates it proposes, the promotion rule and the event payloads it appends. No Temporal here: the
workflow in ``workflows/`` drives these, and tests use them directly.
"""
