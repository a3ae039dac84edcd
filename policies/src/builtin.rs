//! Built-in tools: file and shell operations that run *inside* the sandbox, confined like
//! any command, with input schemas airlock provides.

use serde_json::{Value, json};

/// A built-in tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    /// Read a file (text), optionally from an offset and up to a byte count.
    ReadFile,
    /// Write (or append to) a file.
    WriteFile,
    /// List a directory as JSON.
    ListDir,
    /// Replace exactly one occurrence of a text in a file.
    Edit,
    /// Run a shell command string inside the sandbox (never on the host).
    Bash,
}

impl Builtin {
    /// Every built-in, for listings and error messages.
    pub const ALL: [Builtin; 5] = [
        Builtin::ReadFile,
        Builtin::WriteFile,
        Builtin::ListDir,
        Builtin::Edit,
        Builtin::Bash,
    ];

    /// The name used in policy files and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::WriteFile => "write_file",
            Builtin::ListDir => "list_dir",
            Builtin::Edit => "edit",
            Builtin::Bash => "bash",
        }
    }

    /// The built-in of that name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Whether it only reads.
    pub fn is_read_only(self) -> bool {
        matches!(self, Builtin::ReadFile | Builtin::ListDir)
    }

    /// The default input schema (closed objects, bounded strings).
    pub fn input_schema(self) -> Value {
        let path = json!({"type": "string", "minLength": 1, "maxLength": 4096});
        match self {
            Builtin::ReadFile => json!({
                "type": "object",
                "properties": {
                    "path": path,
                    "offset": {"type": "integer", "minimum": 0},
                    "max_bytes": {"type": "integer", "minimum": 1, "maximum": 16777216}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
            Builtin::WriteFile => json!({
                "type": "object",
                "properties": {
                    "path": path,
                    "content": {"type": "string", "maxLength": 16777216},
                    "append": {"type": "boolean"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
            Builtin::ListDir => json!({
                "type": "object",
                "properties": {"path": path},
                "required": ["path"],
                "additionalProperties": false
            }),
            Builtin::Edit => json!({
                "type": "object",
                "properties": {
                    "path": path,
                    "old_text": {"type": "string", "minLength": 1, "maxLength": 1048576},
                    "new_text": {"type": "string", "maxLength": 1048576}
                },
                "required": ["path", "old_text", "new_text"],
                "additionalProperties": false
            }),
            Builtin::Bash => json!({
                "type": "object",
                "properties": {"command": {"type": "string", "minLength": 1, "maxLength": 65536}},
                "required": ["command"],
                "additionalProperties": false
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_schema_compiles_and_round_trips_its_name() {
        for b in Builtin::ALL {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            crate::schema::compile_schema(&b.input_schema()).unwrap();
        }
        assert_eq!(Builtin::from_name("rm_rf"), None);
    }
}
