"""moto's server (argv as `python3 -m moto.server`) with IAM evaluated as AWS does for what the
run-confinement test (test/integration/run-confinement.test.ts) asks of it; IAM is enforced only
once the test posts `/moto-api/reset-auth` (moto's `INITIAL_NO_AUTH_ACTION_COUNT`).

moto 5.2.1 evaluates an assumed role's own policies (never its session policy, docs/decisions.md
D15), and two gaps of that evaluation would hide what the test checks; this wrapper closes them
and changes nothing else:

- its resource matcher (`IAMPolicyStatement._match`) turns `*` into `.*` and leaves the rest as
  regular-expression syntax: IAM's `?` (one character, as in `kapp-lambda/<id>/<stage>-??????`,
  the six characters Secrets Manager appends to a secret's name) is a regex quantifier there, and
  `??????` does not even compile ("multiple repeat"), and `.` matches any character. Here a
  pattern is IAM's: `*` any run of characters, `?` one character, everything else literal.
- Secrets Manager's requests are checked against the resource `*` (its responses define no
  `_determine_resource`), so a statement naming a secret's ARN never matches. Here the resource
  is the ARN of the secret `SecretId` names (name, full or partial ARN), or the ARN that id would
  have when no such secret exists.
- a request IAM refuses is answered in S3's XML (`AccessDenied`) whatever the service, which a
  JSON-protocol client (Secrets Manager) cannot read; here Secrets Manager answers as AWS does,
  JSON `AccessDeniedException` with status 403.
"""
import re
import sys

from moto.core.exceptions import JsonRESTError
from moto.iam.access_control import IAMPolicyStatement, IAMRequest
from moto.secretsmanager.responses import SecretsManagerResponse
from moto.server import main


def _iam_match(pattern, string):
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, string, re.DOTALL)


def _secret_resource(self):
    try:
        secret_id = self._get_param("SecretId")
    except Exception:  # a request without a JSON body names no secret
        secret_id = None
    if not secret_id:
        return "*"
    secret = self.backend.secrets.get(secret_id)
    if secret is not None:
        return secret.arn
    if secret_id.startswith("arn:"):
        return secret_id
    return f"arn:aws:secretsmanager:{self.region}:{self.current_account}:secret:{secret_id}"


class _JsonAccessDenied(JsonRESTError):
    code = 403


_moto_access_denied = IAMRequest._raise_access_denied


def _access_denied(self):
    if self._service == "secretsmanager":
        raise _JsonAccessDenied(
            "AccessDeniedException",
            f"User: {self._access_key.arn} is not authorized to perform: {self._action}",
        )
    _moto_access_denied(self)


IAMPolicyStatement._match = staticmethod(_iam_match)
IAMRequest._raise_access_denied = _access_denied
SecretsManagerResponse._determine_resource = _secret_resource

if __name__ == "__main__":
    main(sys.argv[1:])
