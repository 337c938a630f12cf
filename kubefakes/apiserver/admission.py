"""Who is asking, and what the admission webhooks say: bearer tokens to users, and the mutating
webhooks of the stored ``MutatingWebhookConfiguration`` objects called on CREATE and UPDATE.

What kube-apiserver does and this reproduces (k8s-protocols: "Mutating admission webhook"):

* **Authentication.** A bearer token names a user (``username``, ``uid``, ``groups``); an unknown
  token is ``401 Unauthorized``; a request without one is ``system:anonymous``. There is no
  authorization: every user may do everything.
* **Which webhooks run.** A webhook runs for a request when one of its ``rules`` matches the
  operation (``CREATE``, ``UPDATE`` or ``*``), group, version and resource (``pods``; ``pods/status``
  and other subresources only when named, ``*`` and ``*/*`` as the API server reads them) and its
  scope, its ``namespaceSelector`` matches the namespace's labels (a namespace that is not stored has
  only ``kubernetes.io/metadata.name``) and its ``objectSelector`` matches the new object's labels or,
  on UPDATE, the old one's. Webhooks run in order: configurations by name, webhooks in list order.
  ``matchConditions`` (CEL) are not evaluated: a webhook with them runs as if they held.
* **The call.** ``POST <url or https://<service>.<namespace>.svc:<port><path>>?timeout=<N>s`` of an
  AdmissionReview in the first of ``admissionReviewVersions`` it knows (v1, then v1beta1), over TLS
  verified against ``caBundle`` with the server name of the URL or ``<service>.<namespace>.svc``.
  A service reference is reached at the address `Admission.service_endpoints` gives it (there is no
  cluster DNS here). The request carries ``uid``, ``kind``, ``resource``, ``name``, ``namespace``,
  ``operation``, ``userInfo``, ``object``, ``oldObject`` (UPDATE), ``dryRun``, ``options``.
* **The answer.** HTTP 200 with an AdmissionReview of the same version and ``response.uid`` equal to
  the request's; ``patch`` and ``patchType: JSONPatch`` together. ``allowed: false`` (or no
  ``allowed``) is a denial: ``admission webhook "<name>" denied the request: <message>`` with the
  status code (at least 400). Transport errors, other statuses, timeouts and invalid answers follow
  ``failurePolicy`` (``Fail``, the default: ``500 failed calling webhook "<name>": <why>``;
  ``Ignore``: the webhook is skipped). A patch that does not apply is a 500 whatever the policy.
* **dryRun.** A webhook whose ``sideEffects`` is not ``None``/``NoneOnDryRun`` is not called for a
  dry run; the request is refused with 400.
* **ValidatingAdmissionPolicy** (admissionregistration.k8s.io/v1) after the mutating webhooks: a
  policy bound by a ``ValidatingAdmissionPolicyBinding`` whose ``validationActions`` hold ``Deny``
  applies when its ``matchConstraints.resourceRules`` match and every ``matchConditions`` expression
  is true; then each ``validations`` expression must be true, else the request is refused with
  ``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>'
  denied request: <message>`` (HTTP 403 for reason Forbidden, else 422). Expressions are CEL over
  ``object``, ``oldObject`` and ``request`` (``userInfo``, ``operation``, ``namespace``, ``name``),
  evaluated with cel-python; an expression that fails to evaluate follows the policy's
  ``failurePolicy`` (``Fail`` refuses). Params, ``variables`` and ``auditAnnotations`` are not
  implemented.

`Admission.admit` is called by the HTTP layer (`kubefakes.apiserver.routes`) with the object as it
would be stored; requests made through `Store` directly (test seeding) are never admitted.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from kubefakes.apiserver.patches import PatchError, deep_copy, json_patch
from kubefakes.apiserver.resources import ResourceInfo, object_meta, with_type
from kubefakes.apiserver.status import ApiStatusError, status_body

#: The user of the kubeconfig `write_kubeconfig` writes by default (cluster-admin as kubeadm names it).
ADMIN = {"username": "kubernetes-admin", "uid": "", "groups": ["system:masters", "system:authenticated"]}
ANONYMOUS = {"username": "system:anonymous", "uid": "", "groups": ["system:unauthenticated"]}
DEFAULT_TOKEN = "fake-token"
_REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


@dataclass(frozen=True)
class Webhook:
    """One webhook of a stored configuration, in the order it runs."""

    config: str
    spec: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.spec.get("name", ""))


def service_account_user(namespace: str, name: str) -> dict[str, Any]:
    """The userInfo kube-apiserver gives a service account's token."""
    return {
        "username": f"system:serviceaccount:{namespace}:{name}",
        "uid": str(uuid.uuid4()),
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    }


def _label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector (matchLabels, matchExpressions) against `labels`; None or {} matches all."""
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _rule_matches(
    rule: Mapping[str, Any], operation: str, info: ResourceInfo, sub: str, namespaced: bool
) -> bool:
    ops = rule.get("operations") or []
    if "*" not in ops and operation not in ops:
        return False
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and info.group not in groups:
        return False
    if "*" not in versions and info.version not in versions:
        return False
    wanted = f"{info.plural}/{sub}" if sub else info.plural
    resources = rule.get("resources") or []
    ok = False
    for r in resources:
        name, _, rsub = r.partition("/")
        if r == wanted or r == "*/*" or (r == "*" and not sub):
            ok = True
        elif name == info.plural and rsub == "*" and sub:
            ok = True
        elif name == "*" and rsub == sub and sub:
            ok = True
    if not ok:
        return False
    scope = rule.get("scope") or "*"
    return scope == "*" or (scope == "Namespaced") == namespaced


class Admission:
    """Authentication and the mutating admission webhooks of one `FakeApiServer`.

    `tokens`: bearer token -> userInfo (``username``, ``uid``, ``groups``); `service_endpoints`:
    (namespace, service name) -> (host, port) where a webhook's service reference is reached.
    """

    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {DEFAULT_TOKEN: dict(ADMIN)}
        self.service_endpoints: dict[tuple[str, str], tuple[str, int]] = {}
        self.calls = 0  # webhook calls made (tests)

    # -- authentication ------------------------------------------------------------------------------

    def add_user(self, token: str, user: Mapping[str, Any]) -> None:
        """Requests bearing `token` are made by `user` (a userInfo dict)."""
        self.tokens[token] = {"uid": "", "groups": ["system:authenticated"], **dict(user)}

    def user_of(self, authorization: str | None) -> dict[str, Any]:
        """The userInfo of a request's ``Authorization`` header. Raises ApiStatusError 401."""
        if not authorization:
            return dict(ANONYMOUS)
        kind, _, token = authorization.partition(" ")
        user = self.tokens.get(token.strip()) if kind.lower() == "bearer" else None
        if user is None:
            raise ApiStatusError(401, status_body(401, "Unauthorized"))
        return dict(user)

    # -- admission ------------------------------------------------------------------------------------

    @staticmethod
    def webhooks(configs: list[dict[str, Any]]) -> list[Webhook]:
        """Every webhook of the stored configurations, in the order the API server runs them."""
        out = []
        for cfg in sorted(configs, key=lambda c: object_meta(c).get("name", "")):
            for hook in cfg.get("webhooks") or []:
                out.append(Webhook(object_meta(cfg).get("name", ""), hook))
        return out

    def matching(
        self,
        hooks: list[Webhook],
        *,
        operation: str,
        info: ResourceInfo,
        sub: str,
        namespace_labels: Mapping[str, str] | None,
        obj: Mapping[str, Any] | None,
        old: Mapping[str, Any] | None,
    ) -> list[Webhook]:
        out = []
        for h in hooks:
            rules = h.spec.get("rules") or []
            if not any(_rule_matches(r, operation, info, sub, info.namespaced) for r in rules):
                continue
            if info.namespaced and not _label_selector_matches(
                h.spec.get("namespaceSelector"), namespace_labels or {}
            ):
                continue
            selector = h.spec.get("objectSelector")
            labels = [object_meta(o).get("labels") or {} for o in (obj, old) if o is not None]
            if selector and not any(_label_selector_matches(selector, lab) for lab in labels):
                continue
            out.append(h)
        return out

    async def admit(
        self,
        hooks: list[Webhook],
        *,
        operation: str,
        info: ResourceInfo,
        namespace: str,
        name: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        user: Mapping[str, Any],
        dry_run: bool,
    ) -> dict[str, Any]:
        """Run `hooks` (already matched) in order over `obj`; returns the object after their patches.

        Raises ApiStatusError: the denial (code >= 400), a failed call under ``failurePolicy: Fail``
        (500), a patch that does not apply (500), a dry run of a webhook with side effects (400).
        """
        current = deep_copy(obj)
        for hook in hooks:
            spec = hook.spec
            if dry_run and spec.get("sideEffects") not in ("None", "NoneOnDryRun"):
                raise ApiStatusError(
                    400, status_body(400, f'admission webhook "{hook.name}" does not support dry run')
                )
            try:
                response, version = await self._call(
                    hook, operation, info, namespace, name, current, old, user, dry_run
                )
            except _CallError as e:
                if (spec.get("failurePolicy") or "Fail") == "Ignore":
                    continue
                raise ApiStatusError(
                    500,
                    status_body(500, f'Internal error occurred: failed calling webhook "{hook.name}": {e}'),
                ) from None
            if not response.get("allowed"):
                status = response.get("status") or {}
                code = max(int(status.get("code") or 400), 400)
                why = status.get("message") or status.get("reason")
                text = f"denied the request: {why}" if why else "denied the request without explanation"
                raise ApiStatusError(
                    code,
                    status_body(
                        code, f'admission webhook "{hook.name}" {text}', reason=status.get("reason") or None
                    ),
                )
            patch = response.get("patch")
            if patch:
                try:
                    ops = json.loads(base64.b64decode(patch))
                    current = json_patch(with_type(info, current), ops)
                except (ValueError, PatchError) as e:
                    raise ApiStatusError(
                        500,
                        status_body(500, f'Internal error occurred: admission webhook "{hook.name}": {e}'),
                    ) from None
                current.pop("kind", None)
                current.pop("apiVersion", None)
            del version
        return current

    async def _call(
        self,
        hook: Webhook,
        operation: str,
        info: ResourceInfo,
        namespace: str,
        name: str,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        user: Mapping[str, Any],
        dry_run: bool,
    ) -> tuple[dict[str, Any], str]:
        spec = hook.spec
        versions = [
            v
            for v in (f"admission.k8s.io/{x}" for x in spec.get("admissionReviewVersions") or [])
            if v in _REVIEW_VERSIONS
        ]
        if not versions:
            raise _CallError("no admissionReviewVersions this server knows (v1, v1beta1)")
        version = versions[0]
        timeout = int(spec.get("timeoutSeconds") or 10)
        url, server_name = self._url(spec.get("clientConfig") or {})
        ctx = ssl.create_default_context()
        ca = (spec.get("clientConfig") or {}).get("caBundle")
        if ca:
            ctx.load_verify_locations(cadata=base64.b64decode(ca).decode())
        uid = str(uuid.uuid4())
        gvk = {"group": info.group, "version": info.version, "kind": info.kind}
        gvr = {"group": info.group, "version": info.version, "resource": info.plural}
        request: dict[str, Any] = {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {k: user[k] for k in ("username", "uid", "groups") if k in user},
            "object": with_type(info, obj),
            "oldObject": with_type(info, old) if old is not None else None,
            "dryRun": dry_run,
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "CreateOptions" if operation == "CREATE" else "UpdateOptions",
            },
        }
        review = {"apiVersion": version, "kind": "AdmissionReview", "request": request}
        self.calls += 1
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                async with session.post(
                    f"{url}{'&' if '?' in url else '?'}timeout={timeout}s",
                    data=json.dumps(review).encode(),
                    headers={"Content-Type": "application/json"},
                    ssl=ctx,
                    server_hostname=server_name,
                ) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise _CallError(f"expected response code 200, got {r.status}: {body[:200]!r}")
        except (TimeoutError, aiohttp.ClientError, ssl.SSLError, OSError) as e:
            raise _CallError(f"Post {url!r}: {type(e).__name__}: {e}") from None
        try:
            answer = json.loads(body)
        except ValueError as e:
            raise _CallError(f"response is not JSON: {e}") from None
        if (
            not isinstance(answer, dict)
            or answer.get("apiVersion") != version
            or answer.get("kind") != "AdmissionReview"
        ):
            raise _CallError(f"expected webhook response of {version}, Kind=AdmissionReview")
        response = answer.get("response")
        if not isinstance(response, dict):
            raise _CallError("webhook response was absent")
        if response.get("uid") != uid:
            raise _CallError(f'expected response.uid="{uid}", got "{response.get("uid")}"')
        if bool(response.get("patch")) != bool(response.get("patchType")):
            raise _CallError("webhook returned response.patch and response.patchType only together")
        if response.get("patchType") not in (None, "JSONPatch"):
            raise _CallError(f"unsupported patch type {response.get('patchType')!r}")
        return response, version

    def _url(self, client: Mapping[str, Any]) -> tuple[str, str]:
        """The URL to POST to and the TLS server name to verify."""
        if client.get("url"):
            url = str(client["url"])
            host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
            return url, host
        svc = client.get("service") or {}
        ns, name = svc.get("namespace", ""), svc.get("name", "")
        endpoint = self.service_endpoints.get((ns, name))
        if endpoint is None:
            raise _CallError(f'service "{name}" not found in namespace "{ns}" (no endpoint registered)')
        host, port = endpoint
        del port  # the Service's port maps to the endpoint's port
        return f"https://{host}:{endpoint[1]}{svc.get('path') or ''}", f"{name}.{ns}.svc"


class _CallError(Exception):
    """A call that failed or answered something that is no valid review (failurePolicy decides)."""


# -- ValidatingAdmissionPolicy ------------------------------------------------------------------------


def validate_policies(
    policies: list[dict[str, Any]],
    bindings: list[dict[str, Any]],
    *,
    operation: str,
    info: ResourceInfo,
    namespace: str,
    name: str,
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Mapping[str, Any],
) -> None:
    """Apply the bound policies to one request. Raises ApiStatusError 403/422 on a denial."""
    by_name = {object_meta(p).get("name", ""): p for p in policies}
    for binding in sorted(bindings, key=lambda b: object_meta(b).get("name", "")):
        bspec = binding.get("spec") or {}
        if "Deny" not in (bspec.get("validationActions") or []):
            continue
        policy = by_name.get(bspec.get("policyName", ""))
        if policy is None:
            continue
        spec = policy.get("spec") or {}
        rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []
        if not any(_rule_matches(r, operation, info, "", info.namespaced) for r in rules):
            continue
        activation = {
            "object": with_type(info, dict(obj)),
            "oldObject": with_type(info, dict(old)) if old is not None else None,
            "request": {
                "userInfo": {k: user[k] for k in ("username", "uid", "groups") if k in user},
                "operation": operation,
                "namespace": namespace,
                "name": name,
                "kind": {"group": info.group, "version": info.version, "kind": info.kind},
            },
        }
        pname, bname = object_meta(policy).get("name", ""), object_meta(binding).get("name", "")
        fail = (spec.get("failurePolicy") or "Fail") == "Fail"

        def refuse(
            message: str, reason: str = "Invalid", pname: str = pname, bname: str = bname
        ) -> ApiStatusError:
            code = 403 if reason == "Forbidden" else 422
            text = (
                f"{info.qualified} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{pname}' with binding "
                f"'{bname}' denied request: {message}"
            )
            return ApiStatusError(code, status_body(code, text, reason=reason))

        try:
            if not all(_cel(c.get("expression", ""), activation) for c in spec.get("matchConditions") or []):
                continue
            for v in spec.get("validations") or []:
                if not _cel(v.get("expression", ""), activation):
                    raise refuse(
                        v.get("message") or f"failed expression: {v.get('expression')}",
                        v.get("reason") or "Invalid",
                    )
        except _CelError as e:
            if fail:
                raise refuse(f"expression could not be evaluated: {e}") from None


class _CelError(Exception):
    pass


def _cel(expression: str, activation: Mapping[str, Any]) -> bool:
    try:
        import celpy  # noqa: PLC0415 - a test dependency, needed only where policies are stored
    except ImportError as e:  # pragma: no cover - cel-python is in the test extra
        raise _CelError(f"cel-python is not installed: {e}") from None
    try:
        env = celpy.Environment()
        program = env.program(env.compile(expression))
        result = program.evaluate({k: celpy.json_to_cel(v) for k, v in activation.items() if v is not None})
    except Exception as e:  # noqa: BLE001 - compile and evaluation errors both follow failurePolicy
        raise _CelError(f"{type(e).__name__}: {e}") from None
    if isinstance(result, Exception):
        raise _CelError(str(result))
    return bool(result)
