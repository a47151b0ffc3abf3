//! Who a CLI command acts for: `--as NAME`, else the OS login name, else `local`, so every
//! task the CLI runs has a principal (in audit lines, events, approval requests, and the
//! host config's `[principals]` policy layer). Names follow the library's one rule
//! ([`quiver::check_principal`]).

/// The name the CLI acts as without `--as`.
pub(crate) const LOCAL: &str = "local";

/// `--as NAME` as clap parses it: a valid principal or an error saying why.
pub(crate) fn parse(name: &str) -> Result<String, String> {
    quiver::check_principal(name)?;
    Ok(name.to_owned())
}

/// `given` (`--as`), else the login name in `USER` or `LOGNAME` if it is a valid principal,
/// else [`LOCAL`].
pub(crate) fn or_login(given: Option<String>) -> String {
    given
        .unwrap_or_else(|| login(|var| std::env::var(var).ok()).unwrap_or_else(|| LOCAL.to_owned()))
}

/// The first of `USER` and `LOGNAME` that `env` has as a valid principal.
fn login(env: impl Fn(&str) -> Option<String>) -> Option<String> {
    ["USER", "LOGNAME"]
        .into_iter()
        .filter_map(env)
        .find(|name| quiver::check_principal(name).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_login_name_is_taken_only_when_valid() {
        let env = |user: Option<&'static str>, logname: Option<&'static str>| {
            move |var: &str| match var {
                "USER" => user.map(str::to_owned),
                "LOGNAME" => logname.map(str::to_owned),
                _ => None,
            }
        };
        assert_eq!(login(env(Some("ann"), Some("bob"))).as_deref(), Some("ann"));
        assert_eq!(
            login(env(Some("a\nb"), Some("bob"))).as_deref(),
            Some("bob")
        );
        assert_eq!(login(env(Some(""), None)), None);
        assert!(parse("x\u{200b}y").is_err());
        assert!(parse(&"a".repeat(129)).is_err());
        assert_eq!(parse("ann@example.com").as_deref(), Ok("ann@example.com"));
    }
}
