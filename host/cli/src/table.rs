//! Plain text tables for the commands that print rows (`mcp status`, `registry list`):
//! columns padded to their widest cell, the last one unpadded, so a line never ends in
//! spaces. Cells must already be printable (see `quiver::text::printable`).

/// Prints `header` and `rows` to stdout.
pub(super) fn print<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
}
