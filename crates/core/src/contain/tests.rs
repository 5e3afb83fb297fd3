use std::io::{Read as _, Write as _};

use super::*;

#[test]
fn paths_inside_are_resolved_and_paths_outside_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/a.txt"), "a").unwrap();
    let canonical = root.canonicalize().unwrap();

    let inside = resolve_inside(&[&root], Path::new("sub/a.txt")).unwrap();
    assert_eq!(inside, canonical.join("sub/a.txt"));
    let new_file = resolve_inside(&[&root], Path::new("sub/new/b.txt")).unwrap();
    assert_eq!(new_file, canonical.join("sub/new/b.txt"));

    for bad in ["../x", "/etc/passwd", "sub/../../x", "sub/missing/../../../x"] {
        let err = resolve_inside(&[&root], Path::new(bad)).unwrap_err();
        assert!(
            matches!(err, ContainError::Outside { .. } | ContainError::Io { .. }),
            "{bad}: {err}"
        );
    }
}

#[test]
fn a_symlink_out_of_the_root_is_refused_and_a_second_root_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let other = dir.path().join("other");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(&other, root.join("link")).unwrap();

    let err = resolve_inside(&[&root], Path::new("link/secret")).unwrap_err();
    assert!(matches!(err, ContainError::Outside { .. }), "{err}");
    let ok = resolve_inside(&[&root, &other], Path::new("link/secret")).unwrap();
    assert_eq!(ok, other.canonicalize().unwrap().join("secret"));
}

#[test]
fn a_dangling_symlink_is_judged_by_its_target() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(dir.path().join("elsewhere/new"), root.join("out")).unwrap();
    std::os::unix::fs::symlink(root.join("later"), root.join("in")).unwrap();

    let err = resolve_inside(&[&root], Path::new("out")).unwrap_err();
    assert!(matches!(err, ContainError::Outside { .. }), "{err}");
    let inside = resolve_inside(&[&root], Path::new("in")).unwrap();
    assert_eq!(inside, root.canonicalize().unwrap().join("later"));
}

/// A user's home holding the gateway's home (`.lemon`, with its secrets,
/// config and a workspace inside it) and a project.
struct Home {
    _tmp: tempfile::TempDir,
    user: PathBuf,
    lemon: PathBuf,
    workspace: PathBuf,
}

impl Home {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let user = tmp.path().canonicalize().unwrap().join("user");
        let lemon = user.join(".lemon");
        let workspace = lemon.join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(user.join("project")).unwrap();
        std::fs::write(lemon.join("secrets.toml"), "lemon_api_token = \"t\"\n").unwrap();
        std::fs::write(lemon.join("config.toml"), "[gateway]\n").unwrap();
        std::fs::write(workspace.join("notes.md"), "notes\n").unwrap();
        std::fs::write(user.join("project/a.txt"), "a\n").unwrap();
        Home { _tmp: tmp, user, lemon, workspace }
    }

    fn off_limits(&self) -> OffLimits {
        OffLimits::new(
            [self.lemon.clone(), self.lemon.join("secrets.toml"), self.lemon.join("config.toml")],
            [self.workspace.clone()],
        )
    }

    /// A run in the user's home with the gateway's workspace.
    fn reach(&self) -> Reach {
        Reach::new([self.user.clone(), self.workspace.clone()], self.off_limits())
    }
}

/// `check(reach, path, expected)`: `Ok(())` when the path is allowed, else the
/// refusal's kind.
fn check(reach: &Reach, path: &str, expected: Result<(), &str>) {
    let got = reach.resolve(Path::new(path)).map(|_| ()).map_err(|err| match err {
        ContainError::Outside { .. } => "outside",
        ContainError::OffLimits { .. } => "off limits",
        ContainError::Changed { .. } => "changed",
        ContainError::Io { .. } => "io",
        ContainError::NoRoots => "no roots",
    });
    assert_eq!(got, expected, "{path}");
}

#[test]
fn the_gateways_home_is_off_limits_but_its_workspace_is_not() {
    let home = Home::new();
    let reach = home.reach();
    check(&reach, "project/a.txt", Ok(()));
    check(&reach, "new/file.txt", Ok(()));
    check(&reach, ".lemon/secrets.toml", Err("off limits"));
    check(&reach, ".lemon/config.toml", Err("off limits"));
    check(&reach, ".lemon/lemon.db", Err("off limits"));
    check(&reach, ".lemon", Err("off limits"));
    check(&reach, ".lemon/new-file", Err("off limits"));
    check(&reach, "project/../.lemon/secrets.toml", Err("off limits"));
    check(&reach, &home.lemon.join("secrets.toml").display().to_string(), Err("off limits"));
    check(&reach, ".lemon/workspace/notes.md", Ok(()));
    check(&reach, &home.workspace.join("new.md").display().to_string(), Ok(()));
    check(&reach, "/etc/passwd", Err("outside"));
}

#[test]
fn a_symlink_into_the_gateways_home_is_refused_wherever_it_is() {
    let home = Home::new();
    let link = |target: &Path, at: &Path| std::os::unix::fs::symlink(target, at).unwrap();
    link(&home.lemon.join("secrets.toml"), &home.user.join("project/s"));
    link(&home.lemon, &home.user.join("project/state"));
    link(&home.lemon.join("config.toml"), &home.workspace.join("c"));
    link(&home.lemon.join("not-yet"), &home.workspace.join("dangling"));
    let reach = home.reach();
    check(&reach, "project/s", Err("off limits"));
    check(&reach, "project/state/config.toml", Err("off limits"));
    check(&reach, "project/state/workspace/notes.md", Ok(()));
    check(&reach, ".lemon/workspace/c", Err("off limits"));
    check(&reach, ".lemon/workspace/dangling", Err("off limits"));
}

#[test]
fn a_state_file_inside_the_workspace_is_denied_again() {
    let home = Home::new();
    let config = home.workspace.join("conf/config.toml");
    std::fs::create_dir_all(config.parent().unwrap()).unwrap();
    std::fs::write(&config, "").unwrap();
    let off_limits = OffLimits::new(
        [home.lemon.clone(), config.parent().unwrap().to_owned()],
        [home.workspace.clone()],
    );
    let reach = Reach::new([home.workspace.clone()], off_limits);
    check(&reach, "notes.md", Ok(()));
    check(&reach, "conf/config.toml", Err("off limits"));
    check(&reach, "conf", Err("off limits"));
}

#[test]
fn a_directory_holding_or_inside_the_state_overlaps_it() {
    let home = Home::new();
    let off_limits = home.off_limits();
    assert!(off_limits.overlaps(&home.user), "the user's home holds .lemon");
    assert!(off_limits.overlaps(Path::new("/")));
    assert!(off_limits.overlaps(&home.lemon));
    assert!(off_limits.overlaps(&home.lemon.join("sessions")));
    assert!(!off_limits.overlaps(&home.workspace), "the workspace is carved out");
    assert!(!off_limits.overlaps(&home.user.join("project")));
    assert!(!off_limits.overlaps(&home.user.join("lemon-workspace")), "not created yet");
    assert!(!OffLimits::none().overlaps(&home.user));
}

#[test]
fn open_reads_writes_and_creates_beneath_the_root() {
    let home = Home::new();
    let reach = home.reach();
    let path = reach.resolve(Path::new("project/a.txt")).unwrap();
    let mut text = String::new();
    reach.open(&path, Access::Read).unwrap().read_to_string(&mut text).unwrap();
    assert_eq!(text, "a\n");

    let new = reach.resolve(Path::new("project/deep/er/b.txt")).unwrap();
    reach.open(&new, Access::Create).unwrap().write_all(b"b").unwrap();
    assert_eq!(std::fs::read_to_string(home.user.join("project/deep/er/b.txt")).unwrap(), "b");

    let in_workspace = reach.resolve(Path::new(".lemon/workspace/notes.md")).unwrap();
    reach.open(&in_workspace, Access::ReadWrite).unwrap();
    let names: Vec<_> = reach
        .read_dir(&reach.resolve(Path::new("project")).unwrap())
        .unwrap()
        .into_iter()
        .map(|(name, kind)| (name.to_string_lossy().into_owned(), kind))
        .collect();
    assert!(names.contains(&("a.txt".to_owned(), EntryKind::File)), "{names:?}");
    assert!(names.contains(&("deep".to_owned(), EntryKind::Dir)), "{names:?}");
}

#[test]
fn open_refuses_a_link_that_appeared_after_the_check() {
    let home = Home::new();
    let reach = home.reach();
    let checked = reach.resolve(Path::new("project/a.txt")).unwrap();
    // Swapped: the project directory is now a link to the gateway's home,
    // which has a file of the same name.
    std::fs::write(home.lemon.join("a.txt"), "secret\n").unwrap();
    std::fs::rename(home.user.join("project"), home.user.join("moved")).unwrap();
    std::os::unix::fs::symlink(&home.lemon, home.user.join("project")).unwrap();
    let err = reach.open(&checked, Access::Read).unwrap_err();
    assert!(matches!(err, ContainError::Changed { .. }), "{err}");
    let err = reach.open(&checked, Access::Create).unwrap_err();
    assert!(matches!(err, ContainError::Changed { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(home.lemon.join("a.txt")).unwrap(), "secret\n");

    // The file itself swapped for a link.
    std::fs::remove_file(home.user.join("project")).unwrap();
    std::fs::rename(home.user.join("moved"), home.user.join("project")).unwrap();
    std::fs::remove_file(home.user.join("project/a.txt")).unwrap();
    std::os::unix::fs::symlink(home.lemon.join("secrets.toml"), home.user.join("project/a.txt"))
        .unwrap();
    let err = reach.open(&checked, Access::Read).unwrap_err();
    assert!(matches!(err, ContainError::Changed { .. }), "{err}");
}

#[test]
fn open_refuses_a_hard_link_to_a_state_file() {
    let home = Home::new();
    let reach = home.reach();
    std::fs::hard_link(home.lemon.join("secrets.toml"), home.user.join("project/copy")).unwrap();
    let path = reach.resolve(Path::new("project/copy")).unwrap();
    let err = reach.open(&path, Access::Read).unwrap_err();
    assert!(matches!(err, ContainError::OffLimits { .. }), "{err}");
}

#[test]
fn open_refuses_state_paths_even_when_asked_directly() {
    let home = Home::new();
    let reach = home.reach();
    let err = reach.open(&home.lemon.join("secrets.toml"), Access::Read).unwrap_err();
    assert!(matches!(err, ContainError::OffLimits { .. }), "{err}");
    let err = reach.read_dir(&home.lemon).unwrap_err();
    assert!(matches!(err, ContainError::OffLimits { .. }), "{err}");
    assert!(!reach.allows(&home.lemon.join("config.toml")));
    assert!(reach.allows(&home.workspace.join("notes.md")));
    assert!(!reach.allows(Path::new("/etc/passwd")));
}
