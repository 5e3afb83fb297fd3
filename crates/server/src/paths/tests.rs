//! What runs may not touch, and where they go instead, for the usual layouts.

use std::collections::BTreeMap;

use super::*;

/// A user's home with the default `~/.lemon` in it (created, as a start does).
fn layout(config_flag: Option<&str>) -> (tempfile::TempDir, PathBuf, Paths) {
    let dir = tempfile::tempdir().unwrap();
    let user = dir.path().canonicalize().unwrap();
    let config = config_flag.map(|rel| user.join(rel));
    let paths = Paths::resolve(config, &BTreeMap::new(), Some(user.clone()));
    std::fs::create_dir_all(paths.home.join("workspace")).unwrap();
    (dir, user, paths)
}

#[test]
fn the_default_home_is_off_limits_but_its_workspace_and_the_users_files_are_not() {
    let (_dir, user, paths) = layout(None);
    let fence = paths.fence(Some(&user), paths.home.join("workspace"));
    assert_eq!(fence.moved_from, None);
    assert_eq!(fence.workspace, paths.home.join("workspace"));
    assert_eq!(fence.spare, user.join("lemon-workspace"));
    let denies = |rel: &str| fence.off_limits.denies(&user.join(rel));
    assert!(denies(".lemon"));
    assert!(denies(".lemon/secrets.toml"));
    assert!(denies(".lemon/config.toml"));
    assert!(denies(".lemon/lemon.db"));
    assert!(denies(".local/share/keyrings/login.keyring"));
    assert!(denies("Library/Keychains/login.keychain-db"));
    assert!(!denies(".lemon/workspace/email/a.pdf"));
    assert!(!denies("code/app/main.rs"));
    assert!(!denies("lemon-workspace/notes.md"));
    assert!(fence.off_limits.overlaps(&user), "$HOME holds the state");
    assert!(!fence.off_limits.overlaps(&fence.spare));
}

#[test]
fn a_workspace_holding_the_home_is_replaced_by_the_spare_directory() {
    let (_dir, user, paths) = layout(None);
    for configured in [user.clone(), paths.home.clone()] {
        let fence = paths.fence(Some(&user), configured.clone());
        assert_eq!(fence.moved_from, Some(configured));
        assert_eq!(fence.workspace, user.join("lemon-workspace"));
        assert!(fence.off_limits.denies(&paths.secrets()));
    }
}

#[test]
fn a_config_in_the_users_home_denies_the_file_not_the_home() {
    let (_dir, user, paths) = layout(Some("lemon.toml"));
    let fence = paths.fence(Some(&user), paths.home.join("workspace"));
    assert!(fence.off_limits.denies(&user.join("lemon.toml")));
    assert!(!fence.off_limits.denies(&user.join("code/main.rs")));
    let (_dir, user, paths) = layout(Some("etc/lemon/config.toml"));
    let fence = paths.fence(Some(&user), paths.home.join("workspace"));
    assert!(fence.off_limits.denies(&user.join("etc/lemon/other.toml")), "its directory");
}
