"""HAMi's mutating admission webhook: sends device pods to our scheduler, fills in defaults, refuses
requests that cannot work, and strips allocation annotations users must not write.

Layers: `review` (AdmissionReview codec) and `patch` (JSON Patch diff) are wire formats; `rules` and
`mutate` decide (calling each vendor of `hami.vendors`); `app`, `tls`, `metrics` and `cli` serve.
"""
