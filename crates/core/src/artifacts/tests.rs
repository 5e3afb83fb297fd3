//! The collector against real files in temporary directories.

use std::fs;

use serde_json::json;

use super::*;

fn completed(kind: ActionKind, detail: Value) -> Action {
    Action {
        id: "a1".to_owned(),
        kind,
        title: "step".to_owned(),
        detail,
        phase: ActionPhase::Completed,
        ok: Some(true),
        message: None,
        level: None,
        result_meta: Value::Null,
    }
}

struct Dirs {
    _tmp: tempfile::TempDir,
    cwd: PathBuf,
    workspace: PathBuf,
    outside: PathBuf,
    /// `cwd/.lemon`, the gateway's home inside the run's directory.
    off_limits: OffLimits,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path().join("cwd");
    let workspace = tmp.path().join("workspace");
    let outside = tmp.path().join("outside");
    for dir in [&cwd, &workspace, &outside] {
        fs::create_dir(dir).unwrap();
    }
    let cwd = cwd.canonicalize().unwrap();
    let workspace = workspace.canonicalize().unwrap();
    let outside = outside.canonicalize().unwrap();
    let off_limits = OffLimits::new([cwd.join(".lemon")], []);
    Dirs { _tmp: tmp, cwd, workspace, outside, off_limits }
}

impl Dirs {
    fn roots(&self, generated_images: bool) -> ArtifactRoots<'_> {
        ArtifactRoots {
            cwd: &self.cwd,
            workspace: Some(&self.workspace),
            off_limits: &self.off_limits,
            generated_images,
        }
    }
}

fn names(collected: &Collected) -> Vec<(&str, Option<&str>)> {
    collected.artifacts.iter().map(|a| (a.filename.as_str(), a.caption.as_deref())).collect()
}

#[test]
fn media_lines_become_files_and_leave_the_text() {
    let d = dirs();
    fs::write(d.cwd.join("chart.png"), b"png").unwrap();
    fs::write(d.cwd.join("my report.pdf"), b"pdf!").unwrap();
    let answer = "Here it is.\nMEDIA: chart.png\n  MEDIA: \"my report.pdf\"  \nDone.\nMEDIA: './chart.png'\n";
    let collected = ArtifactCollector::default().finish(answer, d.roots(false));
    assert_eq!(collected.answer, "Here it is.\nDone.");
    assert_eq!(names(&collected), [("chart.png", None), ("my report.pdf", None)]);
    assert_eq!(collected.artifacts[0].path, d.cwd.join("chart.png"));
    assert_eq!(collected.artifacts[1].size, 4);
    assert_eq!(collected.artifacts[1].mime(), "application/pdf");
    assert!(collected.artifacts[0].is_image());
    assert!(collected.refused.is_empty(), "{:?}", collected.refused);
}

#[test]
fn an_answer_without_media_lines_is_kept_as_it_is() {
    let d = dirs();
    let answer = "no files here\n\nmedia: lower case is text\n";
    let collected = ArtifactCollector::default().finish(answer, d.roots(true));
    assert_eq!(collected.answer, answer);
    assert!(collected.artifacts.is_empty());
}

#[test]
fn missing_files_directories_and_paths_outside_are_refused_and_stripped() {
    let d = dirs();
    fs::write(d.outside.join("secret.txt"), b"x").unwrap();
    fs::create_dir(d.cwd.join("sub")).unwrap();
    let outside = d.outside.join("secret.txt");
    let answer = format!(
        "text\nMEDIA: missing.png\nMEDIA: sub\nMEDIA: {}\nMEDIA: ../outside/secret.txt\nMEDIA: /etc/passwd",
        outside.display()
    );
    let collected = ArtifactCollector::default().finish(&answer, d.roots(false));
    assert_eq!(collected.answer, "text");
    assert!(collected.artifacts.is_empty(), "{:?}", collected.artifacts);
    let reasons: Vec<&str> = collected.refused.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "no such file",
            "not a regular file",
            "outside the working directory and the workspace",
            "outside the working directory and the workspace",
            "outside the working directory and the workspace",
        ]
    );
}

#[cfg(unix)]
#[test]
fn symlinks_out_of_the_roots_are_refused_and_symlinks_inside_resolve() {
    let d = dirs();
    fs::write(d.outside.join("secret.png"), b"x").unwrap();
    fs::write(d.cwd.join("real.png"), b"xy").unwrap();
    std::os::unix::fs::symlink(d.outside.join("secret.png"), d.cwd.join("escape.png")).unwrap();
    std::os::unix::fs::symlink(&d.outside, d.cwd.join("escape_dir")).unwrap();
    std::os::unix::fs::symlink(d.cwd.join("real.png"), d.cwd.join("alias.png")).unwrap();
    let answer = "MEDIA: escape.png\nMEDIA: escape_dir/secret.png\nMEDIA: alias.png";
    let collected = ArtifactCollector::default().finish(answer, d.roots(false));
    assert_eq!(collected.refused.len(), 2, "{:?}", collected.refused);
    assert_eq!(collected.artifacts.len(), 1);
    assert_eq!(collected.artifacts[0].path, d.cwd.join("real.png"));
    assert_eq!(collected.artifacts[0].filename, "real.png");
}

#[test]
fn the_workspace_is_a_root_too() {
    let d = dirs();
    fs::write(d.workspace.join("plot.png"), b"x").unwrap();
    let path = d.workspace.join("plot.png");
    let collected =
        ArtifactCollector::default().finish(&format!("MEDIA: {}", path.display()), d.roots(false));
    assert_eq!(names(&collected), [("plot.png", None)]);
}

#[test]
fn explicit_requests_are_normalised_and_keep_distinct_filenames() {
    let d = dirs();
    fs::write(d.cwd.join("report.txt"), b"r").unwrap();
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(
        ActionKind::Tool,
        json!({ "auto_send_files": [
            { "path": "report.txt", "filename": "delivered.txt", "caption": "  artifact " },
            { "path": "report.txt", "filename": "delivered.txt", "caption": "again" },
            { "path": "report.txt", "caption": "" },
            { "path": 7 },
            { "filename": "no path" },
            "not an object",
        ]}),
    ));
    let collected = collector.finish("MEDIA: report.txt\nok", d.roots(false));
    assert_eq!(names(&collected), [("delivered.txt", Some("artifact")), ("report.txt", None)]);
    assert_eq!(collected.answer, "ok");
}

#[test]
fn the_collector_tolerates_missing_keys_and_ignores_failed_or_unfinished_actions() {
    let d = dirs();
    fs::write(d.cwd.join("a.png"), b"x").unwrap();
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(ActionKind::Tool, Value::Null));
    collector.action(&completed(ActionKind::FileChange, json!({ "changes": "nope" })));
    let mut failed =
        completed(ActionKind::Tool, json!({ "auto_send_files": [{ "path": "a.png" }] }));
    failed.ok = Some(false);
    collector.action(&failed);
    let mut started = failed.clone();
    started.ok = None;
    started.phase = ActionPhase::Started;
    collector.action(&started);
    assert!(collector.finish("", d.roots(true)).artifacts.is_empty());
}

#[test]
fn generated_images_count_only_when_enabled_and_only_added_images() {
    let d = dirs();
    for name in ["new.png", "old.png", "notes.txt", "drawn.jpg"] {
        fs::write(d.cwd.join(name), b"x").unwrap();
    }
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(
        ActionKind::FileChange,
        json!({ "changes": [
            { "path": d.cwd.join("new.png").display().to_string(), "kind": "add" },
            { "path": "old.png", "kind": "update" },
            { "path": "notes.txt", "kind": "add" },
        ]}),
    ));
    collector.action(&completed(
        ActionKind::FileChange,
        json!({ "name": "Write", "input": { "file_path": "drawn.jpg" } }),
    ));
    let off = collector.clone().finish("", d.roots(false));
    assert!(off.artifacts.is_empty());
    let on = collector.finish("", d.roots(true));
    assert_eq!(names(&on), [("new.png", None), ("drawn.jpg", None)]);
}

#[test]
fn generated_and_media_files_add_nothing_to_an_explicit_request_for_the_same_file() {
    let d = dirs();
    fs::write(d.cwd.join("chart.png"), b"x").unwrap();
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(
        ActionKind::Tool,
        json!({ "auto_send_files": [{ "path": "chart.png", "filename": "Chart.png", "caption": "the chart" }] }),
    ));
    collector.action(&completed(
        ActionKind::FileChange,
        json!({ "changes": [{ "path": "chart.png", "kind": "add" }] }),
    ));
    let collected = collector.finish("see\nMEDIA: ./chart.png", d.roots(true));
    assert_eq!(names(&collected), [("Chart.png", Some("the chart"))]);
    assert_eq!(collected.answer, "see");
}

#[test]
fn at_most_the_file_limits_are_sent() {
    let d = dirs();
    let mut answer = String::new();
    let mut changes = Vec::new();
    for i in 0..12 {
        fs::write(d.cwd.join(format!("f{i}.txt")), b"x").unwrap();
        answer.push_str(&format!("MEDIA: f{i}.txt\n"));
    }
    for i in 0..6 {
        fs::write(d.workspace.join(format!("g{i}.png")), b"x").unwrap();
        changes.push(json!({ "path": d.workspace.join(format!("g{i}.png")), "kind": "add" }));
    }
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(ActionKind::FileChange, json!({ "changes": changes })));
    let collected = collector.finish(&answer, d.roots(true));
    assert_eq!(collected.artifacts.len(), MAX_ARTIFACTS);
    assert_eq!(collected.refused.len(), 2 + 6);
    assert!(collected.answer.is_empty());
}

/// The documented cap: at most 4 generated images go with one answer, with
/// room for more files.
#[test]
fn at_most_4_generated_images_go_with_an_answer() {
    let d = dirs();
    let mut changes = Vec::new();
    for i in 0..6 {
        fs::write(d.workspace.join(format!("g{i}.png")), b"x").unwrap();
        changes.push(json!({ "path": d.workspace.join(format!("g{i}.png")), "kind": "add" }));
    }
    let mut collector = ArtifactCollector::default();
    collector.action(&completed(ActionKind::FileChange, json!({ "changes": changes })));
    let collected = collector.finish("Here are the charts.", d.roots(true));
    assert_eq!(collected.artifacts.len(), 4, "{:?}", collected.artifacts);
    let reasons: Vec<&str> = collected.refused.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons, ["more than 4 generated images"; 2]);
}

#[test]
fn the_gateways_state_is_never_sent_even_through_a_link() {
    let d = dirs();
    fs::create_dir(d.cwd.join(".lemon")).unwrap();
    fs::write(d.cwd.join(".lemon/secrets.toml"), b"lemon_api_token = \"t\"").unwrap();
    std::os::unix::fs::symlink(d.cwd.join(".lemon/secrets.toml"), d.workspace.join("s.toml"))
        .unwrap();
    let answer = "Done.\nMEDIA: .lemon/secrets.toml\nMEDIA: s.toml\nMEDIA: ../workspace/s.toml\n";
    let collected = ArtifactCollector::default().finish(answer, d.roots(false));
    assert_eq!(collected.answer, "Done.");
    assert!(collected.artifacts.is_empty(), "{:?}", collected.artifacts);
    let reasons: Vec<_> = collected.refused.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(reasons[0], "the gateway's own state", "{reasons:?}");
    assert_eq!(reasons[2], "the gateway's own state", "{reasons:?}");
}

#[tokio::test]
async fn a_checked_file_is_read_without_following_a_link_swapped_in() {
    let d = dirs();
    fs::create_dir(d.cwd.join("out")).unwrap();
    fs::write(d.cwd.join("out/report.txt"), b"report").unwrap();
    fs::write(d.outside.join("report.txt"), b"secret").unwrap();
    let collected = ArtifactCollector::default().finish("MEDIA: out/report.txt", d.roots(false));
    let artifact = &collected.artifacts[0];
    assert_eq!(artifact.read().await.unwrap(), b"report");
    fs::rename(d.cwd.join("out"), d.cwd.join("moved")).unwrap();
    std::os::unix::fs::symlink(&d.outside, d.cwd.join("out")).unwrap();
    assert!(artifact.read().await.is_err(), "the link was followed");
}
