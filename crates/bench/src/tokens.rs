//! Buyers' bearer tokens, for a server that authenticates them
//! (`FLASHSALE_BUYER_AUTH=jwt` with an HS256 secret): one token per user, all minted
//! before the load starts, so that signing is not part of what is measured.

use std::fmt;

use hyper::header::HeaderValue;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

/// Most users given a token: each costs about 200 bytes and a few microseconds to sign
/// before the run (the rush's 50,000 take about a tenth of a second).
pub const USERS_MAX: u64 = 1_000_000;
/// How long each token is valid: longer than any run, its checks and a `--compare` of
/// several rounds, which all use the tokens minted at their start.
pub const LIFETIME_SECS: u64 = 6 * 3600;

/// `Authorization: Bearer <JWT>` of users 1..=users, `sub` the user id.
pub struct BuyerTokens {
    by_user: Vec<HeaderValue>,
}

impl fmt::Debug for BuyerTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuyerTokens")
            .field("users", &self.by_user.len())
            .finish_non_exhaustive()
    }
}

impl BuyerTokens {
    /// Signs a token for each of users 1..=`users` with the HS256 `secret`.
    pub fn mint(secret: &[u8], users: u64) -> Result<Self, String> {
        if users > USERS_MAX {
            return Err(format!(
                "--buyer-jwt-secret mints a token per user: at most {USERS_MAX} users"
            ));
        }
        let key = EncodingKey::from_secret(secret).map_err(|e| format!("buyer secret: {e}"))?;
        let exp = jsonwebtoken::get_current_timestamp() + LIFETIME_SECS;
        let header = Header::new(Algorithm::HS256);
        let by_user = (1..=users)
            .map(|user| {
                let claims = serde_json::json!({"sub": user.to_string(), "exp": exp});
                let token = encode(&header, &claims, &key).map_err(|e| e.to_string())?;
                HeaderValue::from_str(&format!("Bearer {token}")).map_err(|e| e.to_string())
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { by_user })
    }

    /// The `Authorization` value of `user` (None for a user outside 1..=users).
    pub fn of(&self, user: i64) -> Option<&HeaderValue> {
        let index = usize::try_from(user).ok()?.checked_sub(1)?;
        self.by_user.get(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the minted tokens: one per user, each a bearer JWT whose `sub` is its user,
    // verifiable with the secret; none outside the users, and no more than USERS_MAX.
    #[test]
    fn one_token_per_user() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let tokens = BuyerTokens::mint(secret, 3).expect("mint");
        let key = jsonwebtoken::DecodingKey::from_secret(secret).expect("key");
        for user in 1..=3 {
            let value = tokens.of(user).expect("a token").to_str().expect("ascii");
            let token = value.strip_prefix("Bearer ").expect("bearer");
            let data = jsonwebtoken::decode::<serde_json::Value>(
                token,
                &key,
                &jsonwebtoken::Validation::new(Algorithm::HS256),
            )
            .expect("valid");
            assert_eq!(data.claims["sub"], user.to_string());
        }
        assert!(tokens.of(0).is_none() && tokens.of(4).is_none() && tokens.of(-1).is_none());
        assert!(BuyerTokens::mint(secret, USERS_MAX + 1).is_err());
    }
}
