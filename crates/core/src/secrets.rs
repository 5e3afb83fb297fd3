//! Secret values (API tokens, keys), looked up by name.
//!
//! Config names a secret; the value comes from the sources the app gives, in
//! order: the environment map the app passed in, then `$LEMON_HOME/secrets.toml`
//! (mode 0600). The keychain joins the chain with the desktop app. Values are never
//! logged: [`SecretValue`]'s `Debug` prints a placeholder.
