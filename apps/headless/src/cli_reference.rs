//! The command-line reference page, printed from the clap definition of the
//! command line (`lemon-gateway docs cli`, checked in at
//! `docs/reference/cli.md`): every visible subcommand with its usage, its
//! help and each argument's help, default, choices and environment variable.

use std::fmt::Write as _;

use clap::{Arg, ArgAction, Command};

/// The page for `root` (the whole command line, unbuilt).
pub fn render(root: &Command) -> String {
    let name = root.get_name().to_owned();
    let mut out = String::new();
    let _ = writeln!(out, "# `{name}` command line\n");
    out.push_str(
        "<!-- Printed by `lemon-gateway docs cli` from the command line's definition; a test\n\
         fails when this page differs from what the code prints. Do not edit it by hand:\n\
         change the help texts and run `LEMON_BLESS=1 cargo test -p lemon-gateway\n\
         reference_docs`. -->\n\n",
    );
    if let Some(about) = root.get_long_about().or(root.get_about()) {
        let _ = writeln!(out, "{about}\n");
    }
    let mut commands = Vec::new();
    collect(root, &[], &mut commands);

    out.push_str("## Contents\n\n- [Global options](#global-options)\n");
    for (path, _) in &commands {
        let full = format!("{name} {}", path.join(" "));
        let depth = path.len().saturating_sub(1);
        let _ = writeln!(out, "{}- [`{full}`](#{})", "  ".repeat(depth), anchor(&full));
    }
    if root.get_after_help().is_some() {
        out.push_str("- [Exit codes](#exit-codes)\n");
    }

    out.push_str("\n## Global options\n\nAccepted by every command.\n\n");
    let globals: Vec<&Arg> = root.get_arguments().filter(|arg| arg.is_global_set()).collect();
    arguments(&globals, &mut out);
    out.push_str("| `-h`, `--help` | Print help. |\n");
    if root.get_version().is_some() {
        out.push_str("| `-V`, `--version` | Print the version. |\n");
    }

    for (path, command) in &commands {
        let full = format!("{name} {}", path.join(" "));
        let _ = write!(out, "\n<a id=\"{}\"></a>\n\n## `{full}`\n\n", anchor(&full));
        if let Some(about) = command.get_long_about().or(command.get_about()) {
            let _ = writeln!(out, "{}\n", about.to_string().trim_end());
        }
        let _ = writeln!(out, "```text\n{}\n```", usage(&full, command));
        let args: Vec<&Arg> = command
            .get_arguments()
            .filter(|arg| !arg.is_hide_set() && !arg.is_global_set())
            .collect();
        if !args.is_empty() {
            out.push('\n');
            arguments(&args, &mut out);
        }
        let subcommands: Vec<&Command> = visible(command).collect();
        if !subcommands.is_empty() {
            out.push_str("\nSubcommands: ");
            let links: Vec<String> = subcommands
                .iter()
                .map(|sub| {
                    let sub_full = format!("{full} {}", sub.get_name());
                    format!("[`{}`](#{})", sub.get_name(), anchor(&sub_full))
                })
                .collect();
            out.push_str(&links.join(", "));
            out.push_str(".\n");
        }
    }
    if let Some(after) = root.get_after_help() {
        let text = after.to_string();
        let body = text.strip_prefix("Exit codes:").unwrap_or(&text).trim_matches('\n');
        let _ = write!(out, "\n## Exit codes\n\n```text\n{body}\n```\n");
    }
    out
}

/// The visible subcommands of `command`, in the order they are defined.
fn visible(command: &Command) -> impl Iterator<Item = &Command> {
    command.get_subcommands().filter(|sub| !sub.is_hide_set())
}

/// Every visible subcommand under `command`, depth first, with its path of names.
fn collect<'a>(command: &'a Command, path: &[String], out: &mut Vec<(Vec<String>, &'a Command)>) {
    for sub in visible(command) {
        let mut sub_path = path.to_vec();
        sub_path.push(sub.get_name().to_owned());
        out.push((sub_path.clone(), sub));
        collect(sub, &sub_path, out);
    }
}

/// `lemon-gateway run [OPTIONS] [PROMPT]...`
fn usage(full: &str, command: &Command) -> String {
    let mut line = full.to_owned();
    let visible_args: Vec<&Arg> =
        command.get_arguments().filter(|arg| !arg.is_hide_set() && !arg.is_global_set()).collect();
    if visible_args.iter().any(|arg| !arg.is_positional()) {
        line.push_str(" [OPTIONS]");
    }
    for arg in visible_args.iter().filter(|arg| arg.is_positional()) {
        line.push(' ');
        line.push_str(&positional(arg));
    }
    if command.has_subcommands() {
        line.push_str(if command.is_subcommand_required_set() {
            " <COMMAND>"
        } else {
            " [COMMAND]"
        });
    }
    line
}

fn value_name(arg: &Arg) -> String {
    arg.get_value_names()
        .and_then(|names| names.first())
        .map(ToString::to_string)
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase())
}

fn many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
        || arg.get_num_args().is_some_and(|range| range.max_values() > 1)
}

/// `<RUN>`, `[FILE]`, `[PROMPT]...`
fn positional(arg: &Arg) -> String {
    let name = value_name(arg);
    let text = if arg.is_required_set() { format!("<{name}>") } else { format!("[{name}]") };
    if many(arg) {
        format!("{text}...")
    } else {
        text
    }
}

/// `-c`, `--continue`; `--session <SESSION>`
fn flag(arg: &Arg) -> String {
    let mut names = Vec::new();
    if let Some(short) = arg.get_short() {
        names.push(format!("`-{short}`"));
    }
    if let Some(long) = arg.get_long() {
        let takes_value = matches!(arg.get_action(), ArgAction::Set | ArgAction::Append);
        if takes_value {
            names.push(format!("`--{long} <{}>`", value_name(arg)));
        } else {
            names.push(format!("`--{long}`"));
        }
    }
    names.join(", ")
}

/// A table of `args`: name, then help with default, choices and variable.
fn arguments(args: &[&Arg], out: &mut String) {
    out.push_str("| Argument | Help |\n|---|---|\n");
    for arg in args {
        let name = if arg.is_positional() { format!("`{}`", positional(arg)) } else { flag(arg) };
        let mut help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|help| help.to_string())
            .unwrap_or_default()
            .trim()
            .to_owned();
        // clap drops a help text's last period; the notes after it need one.
        if !help.is_empty() && !help.ends_with(['.', '!', '?', ':']) {
            help.push('.');
        }
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let takes_value =
            arg.is_positional() || matches!(arg.get_action(), ArgAction::Set | ArgAction::Append);
        if takes_value && !defaults.is_empty() {
            let _ = write!(help, " Default: `{}`.", defaults.join(","));
        }
        let choices: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| format!("`{}`", value.get_name()))
            .collect();
        if takes_value && !choices.is_empty() && choices.len() <= 16 {
            let _ = write!(help, " One of {}.", choices.join(", "));
        }
        if let Some(var) = arg.get_env() {
            let _ = write!(help, " Environment: `{}`.", var.to_string_lossy());
        }
        let help = help.trim().replace('|', "\\|").replace("\n\n", "<br><br>").replace('\n', " ");
        let _ = writeln!(out, "| {name} | {help} |");
    }
}

/// The anchor of a heading: `lemon-gateway config init` is
/// `lemon-gateway-config-init`.
fn anchor(heading: &str) -> String {
    let mut out = String::new();
    for c in heading.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Command {
        Command::new("tool")
            .about("A tool.")
            .arg(
                Arg::new("verbose")
                    .long("verbose")
                    .short('v')
                    .global(true)
                    .help("More output.")
                    .action(ArgAction::SetTrue),
            )
            .subcommand(
                Command::new("send")
                    .about("Send a message.")
                    .arg(Arg::new("to").required(true).help("Who gets it."))
                    .arg(
                        Arg::new("format")
                            .long("format")
                            .default_value("text")
                            .value_parser(["text", "json"])
                            .help("How it is written."),
                    )
                    .arg(Arg::new("secret").long("secret").hide(true)),
            )
            .subcommand(Command::new("internal").hide(true).about("Not for people."))
    }

    #[test]
    fn commands_and_their_arguments_are_listed_and_hidden_ones_are_not() {
        let page = render(&sample());
        assert!(page.contains("## `tool send`"), "{page}");
        assert!(page.contains("tool send [OPTIONS] <TO>"), "{page}");
        assert!(page.contains("| `<TO>` | Who gets it. |"), "{page}");
        assert!(
            page.contains("| `--format <FORMAT>` | How it is written. Default: `text`. One of `text`, `json`. |"),
            "{page}"
        );
        assert!(page.contains("| `-v`, `--verbose` | More output. |"), "{page}");
        assert!(!page.contains("internal"), "a hidden command is left out: {page}");
        assert!(!page.contains("--secret"), "a hidden argument is left out: {page}");
    }
}
