//! The Prometheus text format (version 0.0.4), written in the order families are added: every
//! family with its `# HELP` and `# TYPE` lines, its samples after them, the same order at every
//! scrape. (The exporter crate used before wrote `# HELP` only for what was described, and
//! its order moved between scrapes; what `/metrics` serves is a snapshot made per scrape, so
//! a registry of live handles would earn nothing.)

use std::fmt::Write;

/// A metric family's type, as `# TYPE` names it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    /// Only goes up (`_total` in its name).
    Counter,
    /// Any level.
    Gauge,
}

/// The text of one scrape, built family by family.
#[derive(Default)]
pub(crate) struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts family `name`: its `# HELP` and `# TYPE` lines. Its samples follow with `sample`.
    pub(crate) fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        self
    }

    /// One sample of the family just started: `name{labels} value`.
    pub(crate) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.out += name;
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let v = v
                    .replace('\\', r"\\")
                    .replace('"', "\\\"")
                    .replace('\n', r"\n");
                let _ = write!(self.out, "{k}=\"{v}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// The family `name` with one unlabelled sample.
    pub(crate) fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// The whole text.
    pub(crate) fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_in_order_with_help_type_and_escaped_labels() {
        let mut e = Exposition::default();
        e.single("b_total", Kind::Counter, "Second.\nline", 3.0)
            .family("a", Kind::Gauge, "First.")
            .sample("a", &[("peer", "1")], 0.5)
            .sample("a", &[("peer", "q\"\\"), ("x", "y")], 2.0);
        assert_eq!(
            e.finish(),
            "# HELP b_total Second.\\nline\n# TYPE b_total counter\nb_total 3\n\
             # HELP a First.\n# TYPE a gauge\na{peer=\"1\"} 0.5\na{peer=\"q\\\"\\\\\",x=\"y\"} 2\n"
        );
    }
}
