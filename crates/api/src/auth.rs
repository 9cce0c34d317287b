//! Who is asking: the admin's bearer token, and the buyer's identity as
//! `FLASHSALE_BUYER_AUTH` says to learn it — a bearer JWT verified with a configured key,
//! a header set by the authenticating gateway in front, or (development only) nobody's
//! word but the body's `user_id`. Whatever the mode, the identity ends as the domain's
//! [`UserId`], and a request acts, reads and is rate limited as that user only.

use std::fmt;
use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderName};
use flashsale_app::Outcome;
use flashsale_core::{AdminName, UserId};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::traits::PublicKeyParts;
use serde::Deserialize;

use crate::error::ApiError;
use crate::wire::decimal;

/// The admin tokens, each with the name of the admin it stands for
/// (`FLASHSALE_ADMIN_TOKENS`; `FLASHSALE_ADMIN_TOKEN` is `admin`): the name is what the
/// operator's log records.
#[derive(Clone)]
pub struct AdminTokens(Vec<(AdminName, Vec<u8>)>);

impl AdminTokens {
    /// `tokens` as given: the configuration has checked that names and tokens are
    /// distinct and the list is not empty.
    pub fn new(tokens: Vec<(AdminName, String)>) -> Self {
        debug_assert!(!tokens.is_empty(), "at least one admin token");
        Self(
            tokens
                .into_iter()
                .map(|(name, token)| (name, token.into_bytes()))
                .collect(),
        )
    }

    /// The admin whose token `given` is. Every token is compared, each in a time that
    /// tells nothing of it ([`same_token`]), so the answer's time says neither which
    /// token matched nor how much of a guess was right.
    pub fn who(&self, given: &[u8]) -> Option<AdminName> {
        self.0.iter().fold(None, |found, (name, token)| {
            let matched = same_token(given, token);
            found.or_else(|| matched.then(|| name.clone()))
        })
    }

    /// The names, for a log line (never the tokens).
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_str()).collect()
    }
}

impl fmt::Debug for AdminTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AdminTokens({:?})", self.names())
    }
}

/// Whether `given` is the admin token `expected`, in a time that tells nothing of
/// `expected`: both are hashed to digests of one length, compared without an early exit.
/// Compared as they were, a length mismatch returned at once and told the token's length,
/// and the bytes compared before it told how much of a guess was right.
pub(crate) fn same_token(given: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let (given, expected) = (Sha256::digest(given), Sha256::digest(expected));
    given
        .iter()
        .zip(expected.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Largest bearer token verified: a buyer's token is a few hundred bytes (an RS256
/// signature alone is 342); a larger one is refused before any base64 or signature work.
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Clock skew allowed between the token issuer's clock and this instance's, when `exp`
/// and `nbf` are checked: NTP keeps hosts within a second or so; half a minute forgives a
/// drifting one without keeping an expired token alive for long.
pub const CLOCK_SKEW_SECS: u64 = 30;
/// Shortest HS256 secret: RFC 7518 §3.2 asks for a key at least as long as the hash's
/// output, 256 bits; a shorter one can be brute-forced from a single token.
pub const HS256_SECRET_BYTES_MIN: usize = 32;
/// Smallest RSA modulus accepted: NIST SP 800-57 retired anything below 2048 bits.
pub const RSA_MODULUS_BITS_MIN: usize = 2048;
/// The length of an Ed25519 public key.
const ED25519_KEY_BYTES: usize = 32;

/// How a buyer is known (`FLASHSALE_BUYER_AUTH`).
#[derive(Clone, Debug, Default)]
pub enum BuyerAuth {
    /// Nobody vouches for the buyer: the body's `user_id` is taken as given. For
    /// development only: any client can act as any user.
    #[default]
    None,
    /// The gateway in front authenticated the buyer and names them in this header, as a
    /// decimal user id (it must replace any such header a client sent).
    Header(HeaderName),
    /// `Authorization: Bearer <JWT>`, verified with the configured key; `sub` is the
    /// decimal user id.
    Jwt(Arc<JwtVerifier>),
}

/// Verifies buyers' JWTs with one key and that key's one algorithm (a token naming any
/// other algorithm, `none` included, is refused: no algorithm confusion).
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is left out: an HS256 secret must not reach a log.
        f.debug_struct("JwtVerifier")
            .field("algorithm", &self.algorithm())
            .field("issuer", &self.validation.iss)
            .field("audience", &self.validation.aud)
            .finish_non_exhaustive()
    }
}

/// Claims a token must carry besides `sub` and `exp`, when configured.
#[derive(Debug, Clone, Default)]
pub struct ExpectedClaims {
    /// `iss` must be this (`FLASHSALE_BUYER_JWT_ISSUER`).
    pub issuer: Option<String>,
    /// `aud` must name this (`FLASHSALE_BUYER_JWT_AUDIENCE`); when unset, a token with an
    /// `aud` is refused, since it was meant for someone else (RFC 7519 §4.1.3).
    pub audience: Option<String>,
}

/// Why a key cannot verify buyers' tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// An HS256 secret shorter than [`HS256_SECRET_BYTES_MIN`].
    SecretTooShort(usize),
    /// A PEM file holding a private key, where the public key is wanted.
    PrivateKey,
    /// An RSA key with a modulus below [`RSA_MODULUS_BITS_MIN`].
    RsaTooSmall(usize),
    /// Not a PEM public key of RSA or Ed25519, or a damaged one.
    NotAPublicKey(String),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SecretTooShort(n) => write!(
                f,
                "{n} bytes; an HS256 secret needs at least {HS256_SECRET_BYTES_MIN}"
            ),
            Self::PrivateKey => f.write_str("a private key; give the public key"),
            Self::RsaTooSmall(bits) => write!(
                f,
                "an RSA key of {bits} bits; at least {RSA_MODULUS_BITS_MIN} are needed"
            ),
            Self::NotAPublicKey(why) => write!(
                f,
                "not a PEM public key of RSA (RS256) or Ed25519 (EdDSA): {why}"
            ),
        }
    }
}

impl std::error::Error for KeyError {}

/// The claims read from a verified token (the rest — `exp`, `nbf`, `iss`, `aud` — are
/// checked by `jsonwebtoken`).
#[derive(Deserialize)]
struct Claims {
    sub: String,
}

/// Why a request's bearer token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    Missing,
    Expired,
    Invalid,
}

impl JwtVerifier {
    /// HS256 with a shared secret.
    pub fn hs256(secret: &[u8], expected: &ExpectedClaims) -> Result<Self, KeyError> {
        if secret.len() < HS256_SECRET_BYTES_MIN {
            return Err(KeyError::SecretTooShort(secret.len()));
        }
        let key =
            DecodingKey::from_secret(secret).map_err(|e| KeyError::NotAPublicKey(e.to_string()))?;
        Ok(Self::new(key, Algorithm::HS256, expected))
    }

    /// RS256 or EdDSA, as the PEM public key (`-----BEGIN PUBLIC KEY-----`, or PKCS#1's
    /// `RSA PUBLIC KEY`) is of RSA or Ed25519. The key is checked whole now, so that a
    /// damaged one stops startup instead of refusing every token.
    pub fn from_public_pem(pem: &[u8], expected: &ExpectedClaims) -> Result<Self, KeyError> {
        let text = String::from_utf8_lossy(pem);
        if text.contains("PRIVATE KEY-----") {
            return Err(KeyError::PrivateKey);
        }
        if let Ok(key) = DecodingKey::from_ed_pem(pem) {
            let raw = key
                .try_get_as_bytes()
                .map_err(|e| KeyError::NotAPublicKey(e.to_string()))?;
            if raw.len() != ED25519_KEY_BYTES {
                return Err(KeyError::NotAPublicKey(format!(
                    "an Ed25519 key of {} bytes",
                    raw.len()
                )));
            }
            // Builds the verifier, which decodes the key's curve point; a signature of
            // zeros then fails, as expected, only after the key was found good.
            jsonwebtoken::crypto::verify("", b"", &key, Algorithm::EdDSA)
                .map_err(|e| KeyError::NotAPublicKey(e.to_string()))?;
            return Ok(Self::new(key, Algorithm::EdDSA, expected));
        }
        let key = DecodingKey::from_rsa_pem(pem).map_err(|e| {
            KeyError::NotAPublicKey(match e.kind() {
                ErrorKind::InvalidKeyFormat => "unknown key type".to_owned(),
                _ => e.to_string(),
            })
        })?;
        // `jsonwebtoken` decodes an RSA key only at each verification: decode it here.
        let der = key
            .try_get_as_bytes()
            .map_err(|e| KeyError::NotAPublicKey(e.to_string()))?;
        let rsa = rsa::PublicKey::from_pkcs1_der(der)
            .map_err(|e| KeyError::NotAPublicKey(format!("RSA: {e}")))?;
        let bits = rsa.size() * 8;
        if bits < RSA_MODULUS_BITS_MIN {
            return Err(KeyError::RsaTooSmall(bits));
        }
        Ok(Self::new(key, Algorithm::RS256, expected))
    }

    fn new(key: DecodingKey, algorithm: Algorithm, expected: &ExpectedClaims) -> Self {
        // Exactly one algorithm: the key's. `Algorithm` has no `none`, so an unsigned
        // token never parses.
        let mut validation = Validation::new(algorithm);
        validation.leeway = CLOCK_SKEW_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = true;
        let mut required = vec!["exp", "sub"];
        if let Some(issuer) = &expected.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if let Some(audience) = &expected.audience {
            validation.set_audience(&[audience]);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Self { key, validation }
    }

    /// The one algorithm a token may be signed with.
    pub fn algorithm(&self) -> Algorithm {
        self.validation.algorithms[0]
    }

    /// The user a token names, if it is well signed, current and meant for us.
    fn verify(&self, token: &str) -> Result<UserId, Refused> {
        if token.len() > TOKEN_BYTES_MAX {
            return Err(Refused::Invalid);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => Refused::Expired,
                _ => Refused::Invalid,
            },
        )?;
        decimal(&data.claims.sub)
            .and_then(|id| UserId::parse(id).ok())
            .ok_or(Refused::Invalid)
    }
}

impl BuyerAuth {
    /// Whether requests name their buyer themselves (mode `none`).
    pub fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }

    /// The purchase keys this mode writes: scoped by buyer once buyers are
    /// authenticated, as sent otherwise.
    pub fn request_scope(&self) -> flashsale_core::RequestScope {
        match self {
            Self::None => flashsale_core::RequestScope::Global,
            Self::Header(_) | Self::Jwt(_) => flashsale_core::RequestScope::Buyer,
        }
    }

    /// What `serve` warns of at startup: the modes in which whoever reaches the port can
    /// act as any buyer. `none` trusts the body's `user_id`; `header` trusts the header,
    /// which is safe only behind a gateway that sets it and that clients cannot bypass.
    /// `jwt` verifies a signature and needs no warning.
    pub fn startup_warning(&self) -> Option<String> {
        match self {
            Self::None => Some(
                "FLASHSALE_BUYER_AUTH=none: buyers are whoever a request's user_id says; for \
                 development only (set jwt or header in production)"
                    .to_owned(),
            ),
            Self::Header(name) => Some(format!(
                "FLASHSALE_BUYER_AUTH=header: buyers are whoever the {name} header says; \
                 anyone who can reach this port without passing the gateway that sets it \
                 can act as any buyer (listen on an address only the gateway reaches)"
            )),
            Self::Jwt(_) => None,
        }
    }

    /// The authenticated buyer of a request; `None` when authentication is off (the body
    /// then says who). Missing, malformed, forged or expired credentials: 401.
    pub(crate) fn buyer(&self, headers: &HeaderMap) -> Result<Option<UserId>, ApiError> {
        match self {
            Self::None => Ok(None),
            Self::Header(name) => {
                let mut values = headers.get_all(name).iter();
                // One value only: two mean a gateway appended its own to a client's.
                let user = match (values.next(), values.next()) {
                    (Some(v), None) => v
                        .to_str()
                        .ok()
                        .and_then(decimal)
                        .and_then(|id| UserId::parse(id).ok()),
                    _ => None,
                };
                user.map(Some).ok_or_else(|| {
                    ApiError::unauthorized(
                        format!("the buyer must be named by one {name} header, a positive decimal user id"),
                        None,
                    )
                })
            }
            Self::Jwt(verifier) => {
                let verified = match bearer(headers) {
                    Some(token) => verifier.verify(token),
                    None => Err(Refused::Missing),
                };
                verified.map(Some).map_err(|refused| {
                    let (message, challenge) = match refused {
                        Refused::Missing => ("needs Authorization: Bearer <token>", "Bearer"),
                        Refused::Expired => (
                            "the bearer token has expired",
                            r#"Bearer error="invalid_token""#,
                        ),
                        Refused::Invalid => (
                            "the bearer token is invalid",
                            r#"Bearer error="invalid_token""#,
                        ),
                    };
                    ApiError::unauthorized(message, Some(challenge))
                })
            }
        }
    }
}

/// The user a request acts for: the authenticated buyer, whom a body's `user_id`, if
/// given, must name (403 otherwise); with authentication off, the body's `user_id`.
pub(crate) fn acting_user(buyer: Option<UserId>, claimed: Option<i64>) -> Result<UserId, ApiError> {
    match (buyer, claimed) {
        (Some(buyer), None) => Ok(buyer),
        (Some(buyer), Some(claimed)) if claimed == buyer.get() => Ok(buyer),
        (Some(_), Some(_)) => Err(ApiError::new(
            Outcome::Forbidden,
            "user_id: not the authenticated buyer (it may be left out)",
        )),
        (None, Some(claimed)) => {
            UserId::parse(claimed).map_err(|e| ApiError::invalid(e.to_string()))
        }
        (None, None) => Err(ApiError::invalid("user_id: missing")),
    }
}

/// The token of `Authorization: Bearer <token>`, the scheme's name in any case (RFC 7235
/// §2.1), one header only.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

#[cfg(test)]
mod tests {
    // Checks the token comparison: equal tokens pass; a different byte, a prefix, a
    // longer token that starts with it, or an empty token fail. With several tokens, each
    // names its own admin and no other token passes.
    #[test]
    fn admin_token_comparison() {
        assert!(same_token(b"secret", b"secret"));
        assert!(!same_token(b"secreT", b"secret"));
        assert!(!same_token(b"secre", b"secret"));
        assert!(!same_token(b"secrets", b"secret"));
        assert!(!same_token(b"", b"secret"));
        let name = |n: &str| AdminName::parse("name", n).expect("name");
        let tokens = AdminTokens::new(vec![
            (name("alice"), "alice-token".into()),
            (name("bob"), "bob-token-1".into()),
        ]);
        assert_eq!(tokens.who(b"bob-token-1"), Some(name("bob")));
        assert_eq!(tokens.who(b"alice-token"), Some(name("alice")));
        assert_eq!(tokens.who(b"alice-token "), None);
        assert_eq!(tokens.who(b""), None);
        assert!(
            !format!("{tokens:?}").contains("token-1"),
            "no token in a log line"
        );
    }

    use super::*;
    use axum::http::HeaderValue;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn now() -> i64 {
        jsonwebtoken::get_current_timestamp() as i64
    }

    fn hs256(claims: serde_json::Value, secret: &[u8]) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret).unwrap(),
        )
        .unwrap()
    }

    fn jwt(expected: ExpectedClaims) -> BuyerAuth {
        BuyerAuth::Jwt(Arc::new(JwtVerifier::hs256(SECRET, &expected).unwrap()))
    }

    fn buyer_of(auth: &BuyerAuth, token: &str) -> Result<Option<i64>, (u16, String)> {
        auth.buyer(&headers(&[("authorization", &format!("Bearer {token}"))]))
            .map(|u| u.map(UserId::get))
            .map_err(|e| (e.status().as_u16(), e.outcome.as_str().to_owned()))
    }

    // Checks the bearer scheme: its name in any case, one or more spaces before the
    // token; no token, another scheme, a token with a space, or two Authorization
    // headers give none.
    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for (value, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER  abc", Some("abc")),
            ("Basic abc", None),
            ("Bearer ", None),
            ("Bearer", None),
            ("Bearer a b", None),
            ("Bearerabc", None),
        ] {
            assert_eq!(
                bearer(&headers(&[("authorization", value)])),
                want,
                "{value}"
            );
        }
        let two = headers(&[("authorization", "Bearer a"), ("authorization", "Bearer b")]);
        assert_eq!(bearer(&two), None);
    }

    // Checks HS256 verification: a current token names its user; an expired one (past
    // the skew), one signed with another key, an unsigned one (`alg: none`), one of
    // another algorithm, one without `exp` or `sub`, one whose `sub` is no strict decimal
    // id, an oversized one and a missing one are refused 401, each with its challenge.
    #[test]
    fn hs256_tokens() {
        let auth = jwt(ExpectedClaims::default());
        let exp = now() + 600;
        assert_eq!(
            buyer_of(&auth, &hs256(json!({"sub": "42", "exp": exp}), SECRET)),
            Ok(Some(42))
        );
        // Within the skew: still good.
        let just = now() - CLOCK_SKEW_SECS as i64 / 2;
        assert_eq!(
            buyer_of(&auth, &hs256(json!({"sub": "42", "exp": just}), SECRET)),
            Ok(Some(42))
        );
        let unauthorized = Err((401, "unauthorized".to_owned()));
        let past = now() - CLOCK_SKEW_SECS as i64 - 5;
        let other = b"another secret, 32 bytes or more!";
        let header_none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0"; // {"alg":"none","typ":"JWT"}
        let payload = "eyJzdWIiOiI0MiIsImV4cCI6OTk5OTk5OTk5OX0"; // {"sub":"42","exp":9999999999}
        let hs384 = encode(
            &Header::new(Algorithm::HS384),
            &json!({"sub": "42", "exp": exp}),
            &EncodingKey::from_secret(SECRET).unwrap(),
        )
        .unwrap();
        for token in [
            hs256(json!({"sub": "42", "exp": past}), SECRET),
            hs256(json!({"sub": "42", "exp": exp}), other),
            format!("{header_none}.{payload}."),
            hs384,
            hs256(json!({"sub": "42"}), SECRET),
            hs256(json!({"exp": exp}), SECRET),
            hs256(json!({"sub": 42, "exp": exp}), SECRET),
            hs256(json!({"sub": "042", "exp": exp}), SECRET),
            hs256(json!({"sub": "0", "exp": exp}), SECRET),
            hs256(json!({"sub": "-4", "exp": exp}), SECRET),
            hs256(
                json!({"sub": "42", "exp": exp, "pad": "x".repeat(TOKEN_BYTES_MAX)}),
                SECRET,
            ),
            "not.a.token".to_owned(),
        ] {
            assert_eq!(buyer_of(&auth, &token), unauthorized, "{token}");
        }
        let e = auth.buyer(&HeaderMap::new()).unwrap_err();
        assert_eq!(
            (e.status().as_u16(), e.outcome),
            (401, Outcome::Unauthorized)
        );
    }

    // Checks the optional issuer and audience: when configured, a token must carry the
    // configured one; when no audience is configured, a token meant for an audience is
    // refused (it was meant for another service).
    #[test]
    fn issuer_and_audience() {
        let exp = now() + 600;
        let plain = jwt(ExpectedClaims::default());
        let strict = jwt(ExpectedClaims {
            issuer: Some("https://id.example".into()),
            audience: Some("flashsale".into()),
        });
        let good = hs256(
            json!({"sub": "7", "exp": exp, "iss": "https://id.example", "aud": "flashsale"}),
            SECRET,
        );
        assert_eq!(buyer_of(&strict, &good), Ok(Some(7)));
        assert!(buyer_of(&plain, &good).is_err(), "an audience nobody set");
        for claims in [
            json!({"sub": "7", "exp": exp}),
            json!({"sub": "7", "exp": exp, "iss": "https://id.example"}),
            json!({"sub": "7", "exp": exp, "aud": "flashsale"}),
            json!({"sub": "7", "exp": exp, "iss": "https://evil.example", "aud": "flashsale"}),
            json!({"sub": "7", "exp": exp, "iss": "https://id.example", "aud": "shop"}),
        ] {
            assert!(
                buyer_of(&strict, &hs256(claims.clone(), SECRET)).is_err(),
                "{claims}"
            );
        }
        assert_eq!(
            buyer_of(
                &plain,
                &hs256(json!({"sub": "7", "exp": exp, "iss": "x"}), SECRET)
            ),
            Ok(Some(7))
        );
    }

    // Checks the keys refused when configured: a short secret, a private key, text that
    // is no PEM, and a damaged public key.
    #[test]
    fn bad_keys_are_refused() {
        let none = ExpectedClaims::default();
        assert_eq!(
            JwtVerifier::hs256(b"short", &none).unwrap_err(),
            KeyError::SecretTooShort(5)
        );
        let private =
            b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
        assert_eq!(
            JwtVerifier::from_public_pem(private, &none).unwrap_err(),
            KeyError::PrivateKey
        );
        for pem in [
            &b"hello"[..],
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            // An Ed25519 SubjectPublicKeyInfo whose key is 31 bytes.
            b"-----BEGIN PUBLIC KEY-----\nMCkwBQYDK2VwAyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\n-----END PUBLIC KEY-----\n",
        ] {
            assert!(
                matches!(
                    JwtVerifier::from_public_pem(pem, &none),
                    Err(KeyError::NotAPublicKey(_))
                ),
                "{}",
                String::from_utf8_lossy(pem)
            );
        }
    }

    // Checks the startup warnings: `none` and `header`, where whoever reaches the port can
    // be any buyer, each get one naming its mode (the header mode its header too); `jwt`,
    // which verifies a signature, gets none.
    #[test]
    fn the_trusting_modes_warn_at_startup() {
        let none = BuyerAuth::None.startup_warning().expect("none warns");
        assert!(none.contains("FLASHSALE_BUYER_AUTH=none"), "{none}");
        let header = BuyerAuth::Header(HeaderName::from_static("x-user-id"));
        let told = header.startup_warning().expect("header warns");
        assert!(told.contains("FLASHSALE_BUYER_AUTH=header"), "{told}");
        assert!(
            told.contains("x-user-id") && told.contains("any buyer"),
            "{told}"
        );
        assert_eq!(jwt(ExpectedClaims::default()).startup_warning(), None);
    }

    // Checks the header mode: one header with a strict decimal id names the buyer; none,
    // two, or a value that is no positive decimal id is 401.
    #[test]
    fn header_mode() {
        let auth = BuyerAuth::Header(HeaderName::from_static("x-user-id"));
        let user = |h: HeaderMap| auth.buyer(&h).map(|u| u.map(UserId::get)).ok();
        assert_eq!(user(headers(&[("x-user-id", "42")])), Some(Some(42)));
        for bad in [
            "",
            "0",
            "-1",
            "+4",
            "04",
            " 4",
            "4x",
            "99999999999999999999",
        ] {
            assert_eq!(user(headers(&[("x-user-id", bad)])), None, "{bad:?}");
        }
        assert_eq!(user(headers(&[])), None);
        assert_eq!(
            user(headers(&[("x-user-id", "1"), ("x-user-id", "2")])),
            None
        );
        assert_eq!(BuyerAuth::None.buyer(&headers(&[])).ok(), Some(None));
    }

    // Checks whom a request acts for: the buyer, whom the body may name again but not
    // contradict (403); with authentication off, the body's user, which must be there.
    #[test]
    fn the_acting_user() {
        let u = |n| UserId::parse(n).unwrap();
        let code = |r: Result<UserId, ApiError>| r.map(UserId::get).map_err(|e| e.outcome.as_str());
        assert_eq!(code(acting_user(Some(u(4)), None)), Ok(4));
        assert_eq!(code(acting_user(Some(u(4)), Some(4))), Ok(4));
        assert_eq!(code(acting_user(Some(u(4)), Some(5))), Err("forbidden"));
        assert_eq!(code(acting_user(Some(u(4)), Some(0))), Err("forbidden"));
        assert_eq!(code(acting_user(None, Some(5))), Ok(5));
        assert_eq!(code(acting_user(None, Some(0))), Err("invalid_request"));
        assert_eq!(code(acting_user(None, None)), Err("invalid_request"));
    }
}
