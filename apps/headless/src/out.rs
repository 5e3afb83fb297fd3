//! The commands' output on stdout. A reader that went away (`runs | head -1`)
//! ends a client command quietly with exit 0, as command-line tools do,
//! instead of a panic; the server keeps running when its stdout is gone.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a closed stdout ends the process (every command but `serve`).
static QUIT_ON_CLOSED_PIPE: AtomicBool = AtomicBool::new(true);

/// For `serve`: a closed stdout loses the line and nothing else.
pub fn keep_going_on_closed_pipe() {
    QUIT_ON_CLOSED_PIPE.store(false, Ordering::Relaxed);
}

/// Writes `args` (and a newline when `newline`) to stdout at once. A closed
/// pipe ends a client command with exit 0; any other error loses the text.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_fmt(args)
        .and_then(|()| if newline { stdout.write_all(b"\n") } else { Ok(()) })
        .and_then(|()| stdout.flush());
    if let Err(error) = written {
        if error.kind() == std::io::ErrorKind::BrokenPipe
            && QUIT_ON_CLOSED_PIPE.load(Ordering::Relaxed)
        {
            std::process::exit(0);
        }
    }
}

/// `println!` for the commands' output: see [`out::write`](crate::out::write).
#[macro_export]
macro_rules! say {
    () => {
        $crate::out::write(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), true)
    };
}

/// `print!` for the commands' output: see [`out::write`](crate::out::write).
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*), false)
    };
}
