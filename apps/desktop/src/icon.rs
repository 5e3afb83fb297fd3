//! The tray icons, drawn in code as RGBA: a lemon that is plain when idle,
//! carries a green badge with the number of running runs when busy, and turns
//! grey with a red badge when the gateway is failing. Each comes in a variant
//! for light panels (dark outline) and one for dark panels (light outline).

use std::collections::BTreeMap;

/// The side of a tray icon, in pixels.
pub const SIZE: u32 = 32;

/// What the icon says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IconState {
    Idle,
    /// This many runs hold a slot.
    Busy(usize),
    Failing,
}

/// The panel the icon sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Theme {
    Light,
    Dark,
}

impl Theme {
    /// `LEMON_TRAY_THEME=light|dark` when set, else dark when `GTK_THEME`
    /// names a dark theme (`Adwaita:dark`), else dark: most Linux panels are.
    pub fn from_env(env: &BTreeMap<String, String>) -> Theme {
        match env.get("LEMON_TRAY_THEME").map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("light") => return Theme::Light,
            Some("dark") => return Theme::Dark,
            _ => {}
        }
        match env.get("GTK_THEME") {
            Some(theme) if !theme.to_ascii_lowercase().contains("dark") => Theme::Light,
            _ => Theme::Dark,
        }
    }
}

type Rgba = [u8; 4];

const LEMON: Rgba = [0xf5, 0xd3, 0x27, 0xff];
const LEMON_GREY: Rgba = [0xa8, 0xa4, 0x96, 0xff];
const LEAF: Rgba = [0x5a, 0x9e, 0x2f, 0xff];
const BUSY: Rgba = [0x1f, 0x7a, 0x3a, 0xff];
const FAILING: Rgba = [0xd3, 0x2f, 0x2f, 0xff];
const WHITE: Rgba = [0xff, 0xff, 0xff, 0xff];

/// The icon for `state` on a `theme` panel: `SIZE`×`SIZE` RGBA pixels, row by row.
pub fn render(state: IconState, theme: Theme) -> Vec<u8> {
    let mut canvas = Canvas::new(SIZE);
    let outline = match theme {
        Theme::Light => [0x4a, 0x3c, 0x00, 0xff],
        Theme::Dark => [0xff, 0xf6, 0xc8, 0xff],
    };
    let body = if state == IconState::Failing { LEMON_GREY } else { LEMON };
    // The lemon: an ellipse with an outline, and a leaf at the top right.
    canvas.ellipse(15.5, 17.0, 14.0, 10.5, outline);
    canvas.ellipse(15.5, 17.0, 12.5, 9.0, body);
    canvas.ellipse(22.0, 5.5, 4.5, 2.5, LEAF);
    match state {
        IconState::Idle => {}
        IconState::Busy(n) => {
            canvas.ellipse(24.0, 24.0, 7.5, 7.5, BUSY);
            let text = if n > 9 { "+".to_owned() } else { n.to_string() };
            canvas.text(&text, 24, 24, WHITE);
        }
        IconState::Failing => {
            canvas.ellipse(24.0, 24.0, 7.5, 7.5, FAILING);
            canvas.text("!", 24, 24, WHITE);
        }
    }
    canvas.pixels
}

/// 3×5 glyphs, one row per entry, the top bit on the left.
fn glyph(c: char) -> [u8; 5] {
    match c {
        '0' => [0b111, 0b101, 0b101, 0b101, 0b111],
        '1' => [0b010, 0b110, 0b010, 0b010, 0b111],
        '2' => [0b111, 0b001, 0b111, 0b100, 0b111],
        '3' => [0b111, 0b001, 0b111, 0b001, 0b111],
        '4' => [0b101, 0b101, 0b111, 0b001, 0b001],
        '5' => [0b111, 0b100, 0b111, 0b001, 0b111],
        '6' => [0b111, 0b100, 0b111, 0b101, 0b111],
        '7' => [0b111, 0b001, 0b010, 0b010, 0b010],
        '8' => [0b111, 0b101, 0b111, 0b101, 0b111],
        '9' => [0b111, 0b101, 0b111, 0b001, 0b111],
        '+' => [0b000, 0b010, 0b111, 0b010, 0b000],
        '!' => [0b010, 0b010, 0b010, 0b000, 0b010],
        _ => [0; 5],
    }
}

struct Canvas {
    size: u32,
    pixels: Vec<u8>,
}

impl Canvas {
    fn new(size: u32) -> Self {
        Canvas { size, pixels: vec![0; (size * size * 4) as usize] }
    }

    fn set(&mut self, x: i64, y: i64, color: Rgba) {
        if x < 0 || y < 0 || x >= i64::from(self.size) || y >= i64::from(self.size) {
            return;
        }
        let at = ((y as u32 * self.size + x as u32) * 4) as usize;
        self.pixels[at..at + 4].copy_from_slice(&color);
    }

    fn ellipse(&mut self, cx: f64, cy: f64, rx: f64, ry: f64, color: Rgba) {
        for y in 0..self.size {
            for x in 0..self.size {
                let (dx, dy) = ((f64::from(x) + 0.5 - cx) / rx, (f64::from(y) + 0.5 - cy) / ry);
                if dx * dx + dy * dy <= 1.0 {
                    self.set(i64::from(x), i64::from(y), color);
                }
            }
        }
    }

    /// `text` in glyphs scaled ×2, centred on (`cx`, `cy`).
    fn text(&mut self, text: &str, cx: i64, cy: i64, color: Rgba) {
        let scale = 2;
        let width = text.chars().count() as i64 * 4 * scale - scale;
        let (left, top) = (cx - width / 2, cy - 5 * scale / 2);
        for (i, c) in text.chars().enumerate() {
            let x0 = left + i as i64 * 4 * scale;
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..3 {
                    if bits & (0b100 >> col) != 0 {
                        for (sx, sy) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                            self.set(x0 + col * scale + sx, top + row as i64 * scale + sy, color);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(image: &[u8], x: u32, y: u32) -> [u8; 4] {
        let at = ((y * SIZE + x) * 4) as usize;
        image[at..at + 4].try_into().unwrap()
    }

    #[test]
    fn every_state_and_theme_draws_a_distinct_icon_of_the_right_size() {
        let states = [
            IconState::Idle,
            IconState::Busy(1),
            IconState::Busy(2),
            IconState::Busy(12),
            IconState::Failing,
        ];
        let mut seen = Vec::new();
        for state in states {
            for theme in [Theme::Light, Theme::Dark] {
                let image = render(state, theme);
                assert_eq!(image.len(), (SIZE * SIZE * 4) as usize);
                assert!(!seen.contains(&image), "{state:?} {theme:?} looks like another icon");
                seen.push(image);
            }
        }
    }

    #[test]
    fn busy_carries_a_green_badge_failing_a_red_one_and_idle_none() {
        // The badge's edge, clear of the digit in its middle.
        let (x, y) = (19, 24);
        assert_eq!(pixel(&render(IconState::Busy(3), Theme::Dark), x, y), BUSY);
        assert_eq!(pixel(&render(IconState::Failing, Theme::Dark), x, y), FAILING);
        assert_eq!(pixel(&render(IconState::Idle, Theme::Dark), x, y), LEMON);
        // Corners stay transparent.
        assert_eq!(pixel(&render(IconState::Idle, Theme::Light), 0, 0)[3], 0);
    }

    #[test]
    fn the_theme_follows_the_override_then_gtk_theme() {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        assert_eq!(Theme::from_env(&env(&[])), Theme::Dark);
        assert_eq!(Theme::from_env(&env(&[("GTK_THEME", "Adwaita")])), Theme::Light);
        assert_eq!(Theme::from_env(&env(&[("GTK_THEME", "Adwaita:dark")])), Theme::Dark);
        assert_eq!(
            Theme::from_env(&env(&[("GTK_THEME", "Adwaita:dark"), ("LEMON_TRAY_THEME", "light")])),
            Theme::Light
        );
    }
}
