use super::*;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

struct Dirs {
    _tmp: tempfile::TempDir,
    stage: MediaStage,
    cwd: PathBuf,
    home: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let cwd = tmp.path().join("project");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    let stage = MediaStage::new(home.join("media"));
    Dirs { _tmp: tmp, stage, cwd, home }
}

fn off_limits(d: &Dirs) -> OffLimits {
    OffLimits::new([d.home.clone()], [])
}

#[test]
fn an_image_is_known_by_its_bytes_whatever_was_claimed() {
    let d = dirs();
    let files = FilesConfig::default();
    let image = d.stage.keep(&files, Some("shot.bin"), "x", Some("application/pdf"), PNG).unwrap();
    assert_eq!((image.kind, image.mime.as_str()), (AttachmentKind::Image, "image/png"));
    let text = d.stage.keep(&files, Some("a.log"), "x", None, b"line\n").unwrap();
    assert_eq!((text.kind, text.mime.as_str()), (AttachmentKind::File, "text/plain"));
    // A claimed type that is not a media type is not trusted.
    let odd = d.stage.keep(&files, Some("a.pdf"), "x", Some("x\ny"), b"%PDF").unwrap();
    assert_eq!(odd.mime, "application/pdf");
}

#[test]
fn hostile_names_sizes_and_denied_names_are_refused() {
    let d = dirs();
    let files = FilesConfig { max_download_bytes: 10, ..FilesConfig::default() };
    for name in ["../../.bashrc", "a/b.txt", "..", "a\\b", "bad\u{7}.txt", " "] {
        let refused = d.stage.keep(&files, Some(name), "", None, b"x");
        assert!(matches!(refused, Err(MediaRefusal::BadName { .. })), "{name:?}: {refused:?}");
    }
    let big = d.stage.keep(&files, Some("big.bin"), "x", None, &[0; 11]).unwrap_err();
    assert_eq!(big.to_string(), "big.bin is 11 bytes — the limit is 10 bytes");
    let key = d.stage.keep(&files, Some("server.pem"), "x", None, b"k").unwrap_err();
    assert_eq!(key.to_string(), "server.pem is refused (it matches \"**/*.pem\" in deny_globs)");
    // Nothing refused was kept.
    assert!(!d.stage.dir().exists() || std::fs::read_dir(d.stage.dir()).unwrap().count() == 0);
}

#[test]
fn placing_moves_files_under_fresh_names_and_notes_their_paths() {
    let d = dirs();
    let files = FilesConfig::default();
    std::fs::create_dir_all(d.cwd.join(".lemon/uploads")).unwrap();
    std::fs::write(d.cwd.join(".lemon/uploads/report.pdf"), b"older").unwrap();
    let a = d.stage.keep(&files, Some("report.pdf"), "x", None, b"%PDF-1.4 new").unwrap();
    let b = d.stage.keep(&files, None, "photo-1.png", None, PNG).unwrap();
    let placed = place(&[a.clone(), b.clone()], &d.stage, &d.cwd, &off_limits(&d));
    assert!(placed.failed.is_empty(), "{:?}", placed.failed);
    let paths: Vec<_> = placed.attachments.iter().map(|a| a.path.clone()).collect();
    let uploads = d.cwd.canonicalize().unwrap().join(".lemon/uploads");
    assert_eq!(paths, [uploads.join("report-1.pdf"), uploads.join("photo-1.png")]);
    assert_eq!(std::fs::read(&paths[0]).unwrap(), b"%PDF-1.4 new");
    assert_eq!(std::fs::read(uploads.join("report.pdf")).unwrap(), b"older");
    // The stage keeps the files (a retried run places them again) until
    // they are discarded.
    assert_eq!(std::fs::read_dir(d.stage.dir()).unwrap().count(), 2);
    d.stage.discard(&[a, b]);
    assert_eq!(std::fs::read_dir(d.stage.dir()).unwrap().count(), 0);
    let note = placed.note(&d.cwd.canonicalize().unwrap()).unwrap();
    assert!(
        note.contains("- .lemon/uploads/report-1.pdf (file, application/pdf, 12 bytes)"),
        "{note}"
    );
    assert!(note.contains("- .lemon/uploads/photo-1.png (image, image/png, 16 bytes)"), "{note}");
}

#[test]
fn a_link_planted_in_the_uploads_directory_is_not_written_through() {
    let d = dirs();
    let files = FilesConfig::default();
    let outside = d.home.join("secret.txt");
    std::fs::write(&outside, b"keep").unwrap();
    std::fs::create_dir_all(d.cwd.join(".lemon/uploads")).unwrap();
    std::os::unix::fs::symlink(&outside, d.cwd.join(".lemon/uploads/notes.txt")).unwrap();
    let a = d.stage.keep(&files, Some("notes.txt"), "x", None, b"new").unwrap();
    let placed = place(&[a], &d.stage, &d.cwd, &off_limits(&d));
    // The name is taken (by the link): the file goes under the next name.
    assert_eq!(placed.attachments[0].path.file_name().unwrap(), "notes-1.txt");
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep");

    // An uploads directory that is a link out of the project is refused.
    let d = dirs();
    std::fs::create_dir_all(d.cwd.join(".lemon")).unwrap();
    std::os::unix::fs::symlink(&d.home, d.cwd.join(".lemon/uploads")).unwrap();
    let a = d.stage.keep(&files, Some("n.txt"), "x", None, b"new").unwrap();
    let placed = place(&[a], &d.stage, &d.cwd, &off_limits(&d));
    assert!(placed.attachments.is_empty());
    assert_eq!(placed.failed.len(), 1);
    assert!(!d.home.join("n.txt").exists());
}

#[test]
fn only_files_of_the_stage_are_moved() {
    let d = dirs();
    let elsewhere = d.home.join("config.toml");
    std::fs::write(&elsewhere, b"secret").unwrap();
    let forged = Attachment {
        kind: AttachmentKind::File,
        path: elsewhere.clone(),
        name: "config.toml".into(),
        mime: "text/plain".into(),
        bytes: 6,
        uploads_dir: None,
    };
    let placed = place(&[forged], &d.stage, &d.cwd, &off_limits(&d));
    assert!(placed.attachments.is_empty() && placed.failed.is_empty());
    assert!(elsewhere.exists());
    assert!(!d.cwd.join(".lemon/uploads/config.toml").exists());
}

#[test]
fn an_uploads_dir_in_the_gateways_state_is_refused() {
    let d = dirs();
    let files = FilesConfig {
        uploads_dir: Some(d.home.join("up").display().to_string()),
        ..FilesConfig::default()
    };
    let a = d.stage.keep(&files, Some("a.txt"), "x", None, b"a").unwrap();
    let placed = place(&[a], &d.stage, &d.cwd, &off_limits(&d));
    assert!(placed.attachments.is_empty());
    assert!(placed.failed[0].1.contains("gateway's own state"), "{:?}", placed.failed);
}

#[test]
fn attachments_travel_in_meta_and_add_up() {
    let mut meta = BTreeMap::new();
    let one = Attachment {
        kind: AttachmentKind::Image,
        path: "/s/1/a.png".into(),
        name: "a.png".into(),
        mime: "image/png".into(),
        bytes: 1,
        uploads_dir: None,
    };
    add_attachments(&mut meta, std::slice::from_ref(&one));
    add_attachments(&mut meta, std::slice::from_ref(&one));
    assert!(has_attachments(&meta));
    assert_eq!(attachments_of(&meta), vec![one.clone(), one]);
}

#[test]
fn the_files_section_reports_bad_globs_and_dirs() {
    let files = FilesConfig {
        deny_globs: vec!["[".into()],
        uploads_dir: Some("../out".into()),
        ..FilesConfig::default()
    };
    let problems = files.check();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(files.user_allowed("42"));
    let only = FilesConfig { allowed_user_ids: vec![UserId::Number(7)], ..FilesConfig::default() };
    assert!(only.user_allowed("7") && !only.user_allowed("8"));
}

#[test]
fn file_commands_parse_and_malformed_ones_get_the_usage() {
    let put = |path: Option<&str>, force| FileCommand::Put { path: path.map(Into::into), force };
    assert_eq!(parse_file_command("/file put"), Some(Ok(put(None, false))));
    assert_eq!(
        parse_file_command("/file@lemon_bot put docs/"),
        Some(Ok(put(Some("docs/"), false)))
    );
    assert_eq!(parse_file_command("/file put --force a.txt"), Some(Ok(put(Some("a.txt"), true))));
    assert_eq!(
        parse_file_command("/FILE get src/main.rs"),
        Some(Ok(FileCommand::Get { path: "src/main.rs".into() }))
    );
    assert_eq!(parse_file_command("/file get"), Some(Err(FILE_USAGE)));
    assert_eq!(parse_file_command("/file delete x"), Some(Err(FILE_USAGE)));
    assert_eq!(parse_file_command("/filed"), None);
    assert_eq!(parse_file_command("hello /file get x"), None);
}

#[test]
fn file_put_and_get_stay_inside_the_project() {
    let d = dirs();
    let files = FilesConfig::default();
    let limits = off_limits(&d);
    std::fs::write(d.home.join("secrets.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(&d.home, d.cwd.join("home-link")).unwrap();

    let saved =
        put_file(&d.cwd, &limits, &files, Some("docs/"), "spec.pdf", false, b"%PDF").unwrap();
    assert_eq!(saved, Path::new("docs/spec.pdf"));
    let again = put_file(&d.cwd, &limits, &files, Some("docs/spec.pdf"), "x.pdf", false, b"2");
    assert_eq!(
        again.unwrap_err().to_string(),
        "docs/spec.pdf exists; send it with `/file put --force docs/spec.pdf` to replace it"
    );
    put_file(&d.cwd, &limits, &files, Some("docs/spec.pdf"), "x.pdf", true, b"v2").unwrap();
    assert_eq!(
        get_file(&d.cwd, &limits, &files, "docs/spec.pdf").unwrap(),
        ("spec.pdf".into(), b"v2".to_vec())
    );
    let uploaded = put_file(&d.cwd, &limits, &files, None, "a.txt", false, b"a").unwrap();
    assert_eq!(uploaded, Path::new(".lemon/uploads/a.txt"));

    for attack in ["../../.bashrc", "../home/secrets.json", "home-link/secrets.json", "/etc/passwd"]
    {
        let put = put_file(&d.cwd, &limits, &files, Some(attack), "n.txt", true, b"x").unwrap_err();
        assert!(matches!(put, MediaRefusal::Outside { .. }), "put {attack}: {put:?}");
        let get = get_file(&d.cwd, &limits, &files, attack).unwrap_err();
        assert!(matches!(get, MediaRefusal::Outside { .. }), "get {attack}: {get:?}");
    }
    assert_eq!(std::fs::read(d.home.join("secrets.json")).unwrap(), b"{}");
    std::fs::write(d.cwd.join(".env"), b"KEY=1").unwrap();
    let env = get_file(&d.cwd, &limits, &files, ".env").unwrap_err();
    assert!(matches!(env, MediaRefusal::Denied { .. }), "{env:?}");
    let dir = get_file(&d.cwd, &limits, &files, "docs").unwrap_err();
    assert_eq!(dir.to_string(), "docs is not a file");
    let missing = get_file(&d.cwd, &limits, &files, "nope.txt").unwrap_err();
    assert_eq!(missing.to_string(), "nope.txt does not exist in the project");
    let small = FilesConfig { max_upload_bytes: 1, ..FilesConfig::default() };
    let big = get_file(&d.cwd, &limits, &small, "docs/spec.pdf").unwrap_err();
    assert_eq!(big.to_string(), "spec.pdf is 2 bytes — the limit is 1 bytes");
}

#[test]
fn a_sweep_removes_only_staged_files_older_than_its_age() {
    let d = dirs();
    let files = FilesConfig::default();
    let kept = d.stage.keep(&files, Some("a.txt"), "x", None, b"a").unwrap();
    assert_eq!(d.stage.sweep(std::time::Duration::from_secs(3600)), 0);
    assert!(kept.path.exists());
    assert_eq!(d.stage.sweep(std::time::Duration::ZERO), 1);
    assert!(!kept.path.exists());
}
