//! What a test needs of the machine it runs on. Where the machine lacks it
//! (no root for a tmpfs, a low descriptor limit, a missing tool), the test
//! says so and is skipped, unless its `LEMON_REQUIRE_<NEED>=1` is set, as
//! `scripts/test` sets them: then it fails, so a run that is meant to cover
//! everything never passes a test that did not run.

/// Tells the test that the machine lacks `need`: a panic naming `need` when
/// `require_var` is `1`, else a skip line on stderr (where test output is
/// read), after which the caller returns.
///
/// # Panics
/// When `require_var` is set to `1`.
pub fn lacks(require_var: &str, need: &str) {
    if std::env::var(require_var).as_deref() == Ok("1") {
        panic!("{require_var}=1 but this test cannot run here: it needs {need}");
    }
    // The skip is said where the test's output is read.
    #[allow(clippy::print_stderr)]
    {
        eprintln!("skipped: this test needs {need} (with {require_var}=1 it fails instead)");
    }
}
