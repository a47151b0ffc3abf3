//! Guest tools: plain Rust functions that the model can call during a chat session.
//!
//! A [`Tool`] is made by the [`tool!`](crate::tool!) macro from a function taking one
//! deserializable argument struct. The macro generates the entry point the host calls
//! (`extern "C" fn(args_ptr, args_len, out_ptr, out_len_ptr) -> i32`); this module holds the
//! logic behind it, in safe functions on slices, plus the small unsafe shim that turns the
//! host's pointers into slices.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::Errno;

/// The entry point of a guest tool, as the host calls it.
///
/// `args_ptr`/`args_len` hold the arguments (UTF-8 JSON; the host adds a NUL byte after
/// them), `out_ptr`/`out_len_ptr` an output buffer with the ABI's buffer protocol. Returns
/// `0` when the result was written, `-ENOSPC` with the needed length in `*out_len_ptr`, or
/// another `-errno`. On `wasm32` the function pointer's value is its index in the funcref
/// table, which is what `cchat_write_fn` takes as `fn_offset`.
pub type ToolFn =
    extern "C" fn(args_ptr: i32, args_len: i32, out_ptr: i32, out_len_ptr: i32) -> i32;

/// The safe core of a tool: argument bytes in, the result text or an error message out.
type RunFn = fn(&[u8]) -> Result<String, String>;

/// A guest tool: a Rust function the model can call, with the OpenAI definition the model
/// sees.
///
/// Made by [`tool!`](crate::tool!) as a `static`, and registered on a session with
/// [`Chat::tool`](crate::Chat::tool).
#[derive(Clone, Copy)]
pub struct Tool {
    name: &'static str,
    description: &'static str,
    parameters: fn() -> Value,
    entry: ToolFn,
    run: RunFn,
}

impl Tool {
    /// Used by [`tool!`](crate::tool!); not a stable API.
    #[doc(hidden)]
    pub const fn __new(
        name: &'static str,
        description: &'static str,
        parameters: fn() -> Value,
        entry: ToolFn,
        run: RunFn,
    ) -> Tool {
        Tool {
            name,
            description,
            parameters,
            entry,
            run,
        }
    }

    /// The tool's name, as the model sees it.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The tool's description, as the model sees it.
    pub fn description(&self) -> &'static str {
        self.description
    }

    /// The JSON schema of the tool's arguments (built on each call).
    pub fn parameters(&self) -> Value {
        (self.parameters)()
    }

    /// The entry point the host calls.
    pub fn entry(&self) -> ToolFn {
        self.entry
    }

    /// The entry point as `cchat_write_fn`'s `fn_offset`: on `wasm32`, its index in the
    /// funcref table. Meaningless on other targets.
    pub fn fn_offset(&self) -> i32 {
        self.entry as usize as i32
    }

    /// The OpenAI tool definition:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn definition(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(),
            }
        })
    }

    /// Runs the tool in-process with `args_json`, exactly as a call from the model would,
    /// but without the host: `Ok` is the result text the model would see, `Err` the message
    /// it would see as `{"error": message}` (invalid arguments, or the function's `Err`).
    ///
    /// Useful to unit-test tools natively, and to run the model's tool calls yourself when
    /// sending without [`SendFlags::AUTO_TOOL_CALL`](crate::SendFlags::AUTO_TOOL_CALL).
    pub fn call(&self, args_json: &str) -> Result<String, String> {
        (self.run)(args_json.as_bytes())
    }
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("fn_offset", &(self.entry as usize))
            .finish_non_exhaustive()
    }
}

/// True if `name` is a valid guest tool name: `^[a-zA-Z0-9_-]{1,64}$`, not starting with
/// `mcp__` (that prefix belongs to the host's MCP tools).
pub(crate) fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !name.starts_with("mcp__")
}

/// Defines a [`Tool`] `static` from a plain Rust function.
///
/// ```text
/// tool!(
///     [attributes] [visibility] STATIC_NAME = function(ArgsType),
///     "tool_name",
///     "description for the model",
///     [parameters_json_schema_expression,]
/// );
/// ```
///
/// - `function` takes one argument of `ArgsType`, which implements
///   `serde::de::DeserializeOwned` (usually a `#[derive(Deserialize)]` struct; use
///   `serde_json::Value` to take the arguments undecoded). Empty arguments are read as `{}`.
/// - Without a parameters expression, the schema the model sees is derived from
///   `ArgsType`, which must then also `#[derive(schemars::JsonSchema)]` (feature `schema`,
///   on by default): see [`parameters_schema`](crate::parameters_schema). Doc comments on
///   the fields become their descriptions, and serde attributes (`rename`, `default`, ..)
///   are followed, so the schema says what the function decodes. `ArgsType` should be a
///   struct (or a map): the model's arguments are always a JSON object.
/// - It returns either `Result<T, E>` with `T: Serialize` and `E: Display`, or any
///   `T: Serialize`. A `T` that serializes to a JSON string (`String`, `&str`, ..) is passed
///   to the model as-is; any other `T` as JSON text.
/// - When the arguments do not decode, or the function returns `Err(e)`, the model gets
///   `{"error": "<message>"}` as the tool's result, so it can correct itself.
/// - The name and description must be constant `&'static str` expressions; a parameters
///   expression is evaluated each time the definition is built, and must give a
///   `serde_json::Value` (the crate re-exports [`serde_json`](crate::serde_json), so
///   `quiver_guest::serde_json::json!` works without a direct dependency). Write one when
///   the schema cannot be derived, e.g. for `serde_json::Value` arguments.
///
/// The generated entry point follows the ABI's buffer protocol. If the result does not fit
/// the buffer the host offers, it asks for more with `-ENOSPC` and keeps the result, so
/// the host's retry does not run the function twice. If it still does not fit, the model
/// gets an `{"error": ..}` saying so; raise the arena with
/// [`Chat::with_tool_arena`](crate::Chat::with_tool_arena).
///
/// A panic in the function traps, which ends the task; return `Err` instead.
///
/// # Example
///
/// ```
/// use quiver_guest::Tool;
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct WeatherArgs {
///     /// City name, e.g. Paris
///     city: String,
///     /// Celsius unless set
///     #[serde(default)]
///     fahrenheit: bool,
/// }
///
/// fn get_weather(args: WeatherArgs) -> Result<String, String> {
///     if args.city.is_empty() {
///         return Err("city must not be empty".into());
///     }
///     let unit = if args.fahrenheit { "70°F" } else { "21°C" };
///     Ok(format!("Sunny, {unit} in {}", args.city))
/// }
///
/// quiver_guest::tool!(
///     /// Weather lookups for the model.
///     pub GET_WEATHER = get_weather(WeatherArgs),
///     "get_weather",
///     "Current weather for a city",
/// );
///
/// assert_eq!(GET_WEATHER.name(), "get_weather");
/// assert_eq!(
///     GET_WEATHER.parameters(),
///     json!({
///         "type": "object",
///         "properties": {
///             "city": {"type": "string", "description": "City name, e.g. Paris"},
///             "fahrenheit": {"type": "boolean", "description": "Celsius unless set",
///                            "default": false}
///         },
///         "required": ["city"]
///     })
/// );
/// assert_eq!(GET_WEATHER.call(r#"{"city": "Oslo"}"#).unwrap(), "Sunny, 21°C in Oslo");
/// assert!(GET_WEATHER.call("{}").unwrap_err().contains("missing field `city`"));
///
/// // A hand-written schema, for arguments taken undecoded:
/// fn echo(args: serde_json::Value) -> serde_json::Value {
///     args
/// }
/// quiver_guest::tool!(
///     ECHO = echo(serde_json::Value),
///     "echo",
///     "Returns its arguments",
///     json!({"type": "object", "properties": {"text": {"type": "string"}}}),
/// );
/// assert_eq!(ECHO.call(r#"{"text":"hi"}"#).unwrap(), r#"{"text":"hi"}"#);
///
/// // In a guest: chat.tool(&GET_WEATHER)?.tool(&ECHO)?;
/// ```
#[macro_export]
macro_rules! tool {
    (
        $(#[$attr:meta])*
        $vis:vis $static_name:ident = $($function:ident)::+ ($args:ty),
        $name:expr,
        $description:expr $(,)?
    ) => {
        $crate::tool!(
            $(#[$attr])*
            $vis $static_name = $($function)::+ ($args),
            $name,
            $description,
            $crate::__private::parameters_schema::<$args>(),
        );
    };
    (
        $(#[$attr:meta])*
        $vis:vis $static_name:ident = $($function:ident)::+ ($args:ty),
        $name:expr,
        $description:expr,
        $parameters:expr $(,)?
    ) => {
        $(#[$attr])*
        $vis static $static_name: $crate::Tool = {
            fn __quiver_tool_run(
                args: &[u8],
            ) -> ::core::result::Result<
                ::std::string::String,
                ::std::string::String,
            > {
                #[allow(unused_imports)]
                use $crate::__private::{ViaResult as _, ViaSerialize as _};
                $crate::__private::decode_and_run($name, args, |args: $args| {
                    (&&$crate::__private::Wrap($($function)::+(args))).__tool_output()
                })
            }

            extern "C" fn __quiver_tool_entry(
                args_ptr: i32,
                args_len: i32,
                out_ptr: i32,
                out_len_ptr: i32,
            ) -> i32 {
                // SAFETY: the host calls a guest tool with an argument range and an output
                // buffer inside the tool arena, as the ABI describes.
                unsafe {
                    $crate::__private::entry(
                        $name,
                        args_ptr,
                        args_len,
                        out_ptr,
                        out_len_ptr,
                        __quiver_tool_run,
                    )
                }
            }

            fn __quiver_tool_parameters() -> $crate::serde_json::Value {
                $parameters
            }

            $crate::Tool::__new(
                $name,
                $description,
                __quiver_tool_parameters,
                __quiver_tool_entry,
                __quiver_tool_run,
            )
        };
    };
}

/// The JSON schema of a tool's arguments of type `T`, derived with `schemars`, in the form
/// the OpenAI tools API accepts: an object schema with `type`, `properties` and `required`
/// (empty if no field is required), with nested types inlined rather than referenced
/// through `$defs` (recursive types keep their `$defs`), and without the `$schema` and
/// `title` keywords the model does not need.
///
/// This is what [`tool!`](crate::tool!) uses when it is given no schema; call it to inspect
/// a schema, or to adjust one and pass that to `tool!` instead.
///
/// ```
/// use schemars::JsonSchema;
/// use serde::Deserialize;
/// use serde_json::json;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Search {
///     /// What to look for
///     query: String,
///     /// At most this many hits
///     limit: Option<u32>,
///     filter: Filter,
/// }
///
/// #[derive(Deserialize, JsonSchema)]
/// #[serde(rename_all = "snake_case")]
/// enum Filter {
///     Everything,
///     OnlyTitles,
/// }
///
/// let schema = quiver_guest::parameters_schema::<Search>();
/// assert_eq!(schema["type"], "object");
/// assert_eq!(schema["required"], json!(["query", "filter"]));
/// assert_eq!(schema["properties"]["limit"]["type"], json!(["integer", "null"]));
/// assert_eq!(schema["properties"]["filter"]["enum"], json!(["everything", "only_titles"]));
/// assert!(schema.get("$defs").is_none() && schema.get("title").is_none());
/// ```
#[cfg(feature = "schema")]
pub fn parameters_schema<T: schemars::JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| {
            settings.inline_subschemas = true;
            settings.meta_schema = None;
        })
        .into_generator();
    openai_parameters(generator.into_root_schema_for::<T>().to_value())
}

/// Turns a root schema into one the OpenAI tools API accepts (see [`parameters_schema`]).
#[cfg_attr(not(feature = "schema"), allow(dead_code))]
fn openai_parameters(schema: Value) -> Value {
    let mut map = match schema {
        Value::Object(map) => map,
        // `true` (any value): the arguments are still an object.
        _ => serde_json::Map::new(),
    };
    map.remove("$schema");
    map.remove("title");
    if map.is_empty() {
        map.insert("type".into(), json!("object"));
    }
    if map.get("type") == Some(&json!("object")) {
        map.entry("properties").or_insert_with(|| json!({}));
        map.entry("required").or_insert_with(|| json!([]));
    }
    Value::Object(map)
}

/// Support code for [`tool!`](crate::tool!); not a stable API.
#[doc(hidden)]
pub mod rt {
    use super::*;

    #[cfg(feature = "schema")]
    pub use super::parameters_schema;

    /// Decodes the arguments (ignoring the host's trailing NUL; empty arguments are `{}`)
    /// and runs the tool.
    pub fn decode_and_run<A: DeserializeOwned>(
        name: &str,
        args: &[u8],
        f: impl FnOnce(A) -> Result<String, String>,
    ) -> Result<String, String> {
        let mut args = args;
        while let [rest @ .., 0] = args {
            args = rest;
        }
        if args.iter().all(u8::is_ascii_whitespace) {
            args = b"{}";
        }
        let args = serde_json::from_slice(args)
            .map_err(|e| format!("invalid arguments for tool `{name}`: {e}"))?;
        f(args)
    }

    /// Encodes a tool's successful value: a JSON string as its text, anything else as
    /// JSON.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<String, String> {
        match serde_json::to_value(value) {
            Ok(Value::String(text)) => Ok(text),
            Ok(value) => Ok(value.to_string()),
            Err(e) => Err(format!(
                "the tool's result is not serializable as JSON: {e}"
            )),
        }
    }

    /// A tool function's return value, for the autoref dispatch between [`ViaResult`] and
    /// [`ViaSerialize`]: `(&&Wrap(value)).__tool_output()` picks [`ViaResult`] for a
    /// `Result<T: Serialize, E: Display>` and [`ViaSerialize`] for other `Serialize` types.
    pub struct Wrap<T>(pub T);

    /// Output of a tool returning `Result<T, E>`.
    pub trait ViaResult {
        /// The result text, or the error message.
        fn __tool_output(&self) -> Result<String, String>;
    }

    impl<T: Serialize, E: fmt::Display> ViaResult for &Wrap<Result<T, E>> {
        fn __tool_output(&self) -> Result<String, String> {
            match &self.0 {
                Ok(value) => encode(value),
                Err(e) => Err(e.to_string()),
            }
        }
    }

    /// Output of a tool returning a plain `T: Serialize`.
    pub trait ViaSerialize {
        /// The result text, or the error message.
        fn __tool_output(&self) -> Result<String, String>;
    }

    impl<T: Serialize> ViaSerialize for Wrap<T> {
        fn __tool_output(&self) -> Result<String, String> {
            encode(&self.0)
        }
    }

    /// `{"error": message}` as bytes.
    pub fn error_json(message: &str) -> Vec<u8> {
        json!({ "error": message }).to_string().into_bytes()
    }

    /// `{"error": message}`, with `message` cut at a character boundary so that it fits
    /// `cap` bytes; `None` if not even `{"error":""}` fits.
    pub fn fit_error(message: &str, cap: usize) -> Option<Vec<u8>> {
        // serde_json's escaping: two bytes for `"`, `\` and the short control escapes,
        // `\u00XX` for the other control characters.
        let escaped_len = |c: char| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if u32::from(c) < 0x20 => 6,
            c => c.len_utf8(),
        };
        let budget = cap.checked_sub(error_json("").len())?;
        let (mut used, mut end) = (0, 0);
        for (at, c) in message.char_indices() {
            used += escaped_len(c);
            if used > budget {
                break;
            }
            end = at + c.len_utf8();
        }
        loop {
            let bytes = error_json(&message[..end]);
            if bytes.len() <= cap {
                return Some(bytes);
            }
            // Only if the escaping above is wrong: cut one more character.
            end = message[..end].char_indices().last()?.0;
        }
    }

    /// What the entry point answers the host.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Reply {
        /// Write these bytes (they fit the buffer) and return 0.
        Write(Vec<u8>),
        /// Store this needed length and return `-ENOSPC`.
        NoSpace(usize),
        /// Return `-errno`.
        Fail(Errno),
    }

    impl Reply {
        /// Writes the reply into the host's buffer `out` and length word `out_len`, and
        /// returns the entry point's return value.
        pub fn deliver(self, out: &mut [u8], out_len: &mut u32) -> i32 {
            match self {
                Reply::Write(bytes) => {
                    match (out.get_mut(..bytes.len()), u32::try_from(bytes.len())) {
                        (Some(dest), Ok(len)) => {
                            dest.copy_from_slice(&bytes);
                            *out_len = len;
                            0
                        }
                        _ => -Errno::EIO.raw(),
                    }
                }
                Reply::NoSpace(needed) => {
                    *out_len = u32::try_from(needed).unwrap_or(u32::MAX);
                    -Errno::ENOSPC.raw()
                }
                Reply::Fail(errno) => -errno.raw(),
            }
        }
    }

    /// A result kept after `-ENOSPC`, for the host's retry.
    struct Kept {
        tool: &'static str,
        args: Vec<u8>,
        result: Result<String, String>,
    }

    thread_local! {
        static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
    }

    /// One call of the tool `tool` with `args` and an output buffer of `cap` bytes.
    ///
    /// Runs `run(args)`, unless the previous call of the same tool with the same argument
    /// bytes ended in `-ENOSPC`: then that kept result is used, so the host's retry does not
    /// run the tool again. A result that still does not fit on the retry becomes an
    /// `{"error": ..}` the model can read (or `-EIO` if not even that fits).
    pub fn call(
        tool: &'static str,
        args: &[u8],
        cap: usize,
        run: impl FnOnce(&[u8]) -> Result<String, String>,
    ) -> Reply {
        let kept = KEPT
            .with(|kept| kept.borrow_mut().take())
            .filter(|kept| kept.tool == tool && kept.args == args);
        let retry = kept.is_some();
        let result = match kept {
            Some(kept) => kept.result,
            None => run(args),
        };
        let bytes = match &result {
            Ok(text) => Cow::Borrowed(text.as_bytes()),
            Err(message) => Cow::Owned(error_json(message)),
        };
        if bytes.len() <= cap {
            return Reply::Write(bytes.into_owned());
        }
        let needed = bytes.len();
        if !retry {
            KEPT.with(|kept| {
                *kept.borrow_mut() = Some(Kept {
                    tool,
                    args: args.to_vec(),
                    result,
                })
            });
            return Reply::NoSpace(needed);
        }
        let message = match result {
            Err(message) => message,
            Ok(_) => format!(
                "the result of tool `{tool}` ({needed} bytes) does not fit the {cap}-byte \
                 output buffer of the guest's tool arena"
            ),
        };
        fit_error(&message, cap).map_or(Reply::Fail(Errno::EIO), Reply::Write)
    }

    /// The entry point's body: turns the host's pointers into slices around [`call`].
    ///
    /// # Safety
    ///
    /// `args_ptr .. args_ptr + args_len` must be readable, `out_len_ptr` must point at a
    /// `u32` (any alignment) holding the capacity of the writable buffer at `out_ptr`, and
    /// neither may overlap memory Rust code references. The host's tool arena satisfies
    /// this. Only meaningful on `wasm32`, where an `i32` holds a pointer.
    pub unsafe fn entry(
        tool: &'static str,
        args_ptr: i32,
        args_len: i32,
        out_ptr: i32,
        out_len_ptr: i32,
        run: fn(&[u8]) -> Result<String, String>,
    ) -> i32 {
        // The host's integers are addresses in the tool arena, whose provenance the SDK
        // exposed when it lent the arena (or the caller did, with `lend_tool_arena`).
        let ptr = |value: i32| value as u32 as usize;
        let (args_len, out_len_ptr) = (
            ptr(args_len),
            std::ptr::with_exposed_provenance_mut::<u32>(ptr(out_len_ptr)),
        );
        if out_len_ptr.is_null() || (args_len > 0 && args_ptr == 0) {
            return -Errno::EFAULT.raw();
        }
        // The arguments are copied, so nothing refers to the arena while the tool runs
        // (the tool may itself make hostcalls).
        let args = if args_len == 0 {
            Vec::new()
        } else {
            // SAFETY: the caller guarantees the range is readable.
            unsafe {
                std::slice::from_raw_parts(
                    std::ptr::with_exposed_provenance::<u8>(ptr(args_ptr)),
                    args_len,
                )
            }
            .to_vec()
        };
        // SAFETY: the caller guarantees `out_len_ptr` points at a `u32`.
        let cap = unsafe { out_len_ptr.read_unaligned() };
        let reply = call(tool, &args, cap as usize, run);
        let out: &mut [u8] = if cap == 0 {
            &mut []
        } else if out_ptr == 0 {
            return -Errno::EFAULT.raw();
        } else {
            // SAFETY: the caller guarantees `cap` writable bytes at `out_ptr`.
            unsafe {
                std::slice::from_raw_parts_mut(
                    std::ptr::with_exposed_provenance_mut::<u8>(ptr(out_ptr)),
                    cap as usize,
                )
            }
        };
        let mut len = cap;
        let ret = reply.deliver(out, &mut len);
        // SAFETY: as above.
        unsafe { out_len_ptr.write_unaligned(len) };
        ret
    }
}

#[cfg(test)]
mod tests {
    use super::rt::*;
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct WeatherArgs {
        city: String,
    }

    fn get_weather(args: WeatherArgs) -> Result<String, String> {
        if args.city.is_empty() {
            return Err("city must not be empty".into());
        }
        Ok(format!("Sunny, 21°C in {}", args.city))
    }

    crate::tool!(
        GET_WEATHER = get_weather(WeatherArgs),
        "get_weather",
        "Current weather for a city",
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    );

    #[derive(Deserialize)]
    struct AddArgs {
        a: i64,
        b: i64,
    }

    #[derive(Serialize)]
    struct Sum {
        sum: i64,
    }

    mod math {
        use super::*;
        pub fn add(args: AddArgs) -> Sum {
            Sum {
                sum: args.a + args.b,
            }
        }
        pub fn checked_div(args: AddArgs) -> Result<i64, std::num::TryFromIntError> {
            let b = u8::try_from(args.b)?;
            Ok(args.a / i64::from(b))
        }
    }

    crate::tool!(ADD = math::add(AddArgs), "add", "a + b", json!({}));
    crate::tool!(
        #[allow(dead_code)]
        pub(crate) DIV = math::checked_div(AddArgs),
        "div",
        "a / b",
        json!({"type": "object"}),
    );

    fn echo(args: Value) -> Value {
        args
    }
    crate::tool!(ECHO = echo(Value), "echo", "echo", Value::Null);

    #[test]
    fn definition_and_accessors() {
        assert_eq!(
            GET_WEATHER.definition(),
            json!({"type": "function", "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}
            }})
        );
        assert_eq!(GET_WEATHER.name(), "get_weather");
        assert_eq!(GET_WEATHER.description(), "Current weather for a city");
        assert_eq!(GET_WEATHER.fn_offset(), GET_WEATHER.entry() as usize as i32);
        assert!(format!("{GET_WEATHER:?}").contains("get_weather"));
    }

    #[test]
    fn results_strings_and_json() {
        assert_eq!(
            GET_WEATHER.call(r#"{"city":"Paris"}"#),
            Ok("Sunny, 21°C in Paris".to_owned())
        );
        assert_eq!(
            GET_WEATHER.call(r#"{"city":""}"#),
            Err("city must not be empty".into())
        );
        assert_eq!(ADD.call(r#"{"a":2,"b":3}"#), Ok(r#"{"sum":5}"#.to_owned()));
        assert_eq!(DIV.call(r#"{"a":9,"b":3}"#), Ok("3".to_owned()));
        assert!(
            DIV.call(r#"{"a":9,"b":-3}"#)
                .unwrap_err()
                .contains("out of range")
        );
        assert_eq!(
            ECHO.call(r#"{"x":[1,"y"]}"#),
            Ok(r#"{"x":[1,"y"]}"#.to_owned())
        );
        assert_eq!(ECHO.call(r#""text""#), Ok("text".to_owned()));
    }

    #[test]
    fn argument_decoding() {
        // The host's trailing NUL, and empty arguments.
        assert_eq!(ECHO.call("{\"a\":1}\0"), Ok(r#"{"a":1}"#.to_owned()));
        assert_eq!(ECHO.call(""), Ok("{}".to_owned()));
        assert_eq!(ECHO.call(" \n\0"), Ok("{}".to_owned()));
        let err = GET_WEATHER.call(r#"{"town":"Paris"}"#).unwrap_err();
        assert!(err.starts_with("invalid arguments for tool `get_weather`: missing field `city`"));
        let err = ADD.call("not json").unwrap_err();
        assert!(
            err.starts_with("invalid arguments for tool `add`: "),
            "{err}"
        );
    }

    #[test]
    fn valid_names() {
        assert!(valid_name("get_weather"));
        assert!(valid_name("a-B_9"));
        assert!(valid_name(&"x".repeat(64)));
        assert!(!valid_name(&"x".repeat(65)));
        assert!(!valid_name(""));
        assert!(!valid_name("get weather"));
        assert!(!valid_name("mcp.fs.read"));
        assert!(!valid_name("mcp__fs__read"));
        assert!(valid_name("mcp_fs"));
    }

    /// Calls `tool` like the entry point does, with a buffer of `cap` bytes.
    fn host_call(tool: &Tool, args: &str, cap: usize) -> (i32, u32, Vec<u8>) {
        let mut out = vec![0u8; cap];
        let mut len = cap as u32;
        let ret = call(tool.name(), args.as_bytes(), cap, tool.run).deliver(&mut out, &mut len);
        out.truncate((len as usize).min(cap));
        (ret, len, out)
    }

    #[test]
    fn buffer_protocol() {
        let (ret, len, out) = host_call(&GET_WEATHER, r#"{"city":"Rome"}"#, 64);
        assert_eq!(ret, 0);
        assert_eq!(out, "Sunny, 21°C in Rome".as_bytes());
        assert_eq!(len as usize, out.len());

        // Exactly fitting.
        let (ret, _, out) = host_call(&ADD, r#"{"a":1,"b":1}"#, 9);
        assert_eq!((ret, out.as_slice()), (0, &br#"{"sum":2}"#[..]));

        // Errors are results the model reads.
        let (ret, _, out) = host_call(&GET_WEATHER, r#"{"city":""}"#, 64);
        assert_eq!(ret, 0);
        assert_eq!(
            serde_json::from_slice::<Value>(&out).unwrap(),
            json!({"error": "city must not be empty"})
        );
    }

    #[test]
    fn enospc_keeps_the_result_for_the_retry() {
        use std::cell::Cell;
        let runs = Cell::new(0);
        let run = |_: &[u8]| {
            runs.set(runs.get() + 1);
            Ok("x".repeat(100))
        };
        let mut len = 10;
        let mut out = vec![0u8; 10];
        let ret = call("big", b"{}", 10, run).deliver(&mut out, &mut len);
        assert_eq!((ret, len), (-Errno::ENOSPC.raw(), 100));

        // The retry with a big enough buffer gets the kept result without a second run.
        let mut out = vec![0u8; 100];
        let ret = call("big", b"{}", 100, run).deliver(&mut out, &mut len);
        assert_eq!((ret, len, runs.get()), (0, 100, 1));
        assert_eq!(out, "x".repeat(100).as_bytes());

        // The kept result is used once: the next call runs again.
        call("big", b"{}", 100, run);
        assert_eq!(runs.get(), 2);

        // A different call discards the kept result.
        assert_eq!(call("big", b"{}", 10, run), Reply::NoSpace(100));
        assert_eq!(
            call("big", br#"{"a":1}"#, 100, run),
            Reply::Write(vec![b'x'; 100])
        );
        assert_eq!(runs.get(), 4);
        call("big", b"{}", 100, run);
        assert_eq!(runs.get(), 5);
    }

    #[test]
    fn retry_that_still_does_not_fit() {
        let run = |_: &[u8]| Ok("x".repeat(1000));
        assert_eq!(call("huge", b"{}", 200, run), Reply::NoSpace(1000));
        let Reply::Write(bytes) = call("huge", b"{}", 200, run) else {
            panic!("expected an error result");
        };
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            value["error"],
            "the result of tool `huge` (1000 bytes) does not fit the 200-byte output buffer of \
             the guest's tool arena"
        );

        // An error message is cut to fit; below `{"error":""}` nothing fits.
        let run = |_: &[u8]| Err::<String, _>("é".repeat(100));
        assert_eq!(call("err", b"{}", 30, run), Reply::NoSpace(212));
        let Reply::Write(bytes) = call("err", b"{}", 30, run) else {
            panic!("expected a cut error");
        };
        assert!(bytes.len() <= 30);
        let value: Value = serde_json::from_slice(&bytes).unwrap();
        assert!(value["error"].as_str().unwrap().chars().all(|c| c == 'é'));

        assert_eq!(call("err", b"{}", 5, run), Reply::NoSpace(212));
        assert_eq!(call("err", b"{}", 5, run), Reply::Fail(Errno::EIO));
        let mut len = 5;
        assert_eq!(Reply::Fail(Errno::EIO).deliver(&mut [0; 5], &mut len), -5);
    }

    #[test]
    fn fit_error_edges() {
        assert_eq!(fit_error("", 11), None);
        assert_eq!(fit_error("", 12).unwrap(), br#"{"error":""}"#);
        assert_eq!(fit_error("abc", 100).unwrap(), br#"{"error":"abc"}"#);
        assert_eq!(fit_error("abc", 14).unwrap(), br#"{"error":"ab"}"#);
        // Escapes take more room than the raw characters.
        let cut = fit_error("\"\"\"\"", 16).unwrap();
        assert_eq!(cut, br#"{"error":"\"\""}"#);
    }

    #[cfg(feature = "schema")]
    mod schemas {
        use super::*;
        use schemars::JsonSchema;
        use std::collections::BTreeMap;

        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Trip {
            /// Where from
            from: Place,
            to: Place,
            #[serde(rename = "when")]
            date: Option<String>,
            #[serde(default)]
            stops: Vec<Place>,
        }

        /// A place.
        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Place {
            name: String,
            #[serde(default)]
            country: Option<String>,
        }

        fn plan(trip: Trip) -> String {
            format!("{} stops", trip.stops.len())
        }
        crate::tool!(PLAN = plan(Trip), "plan", "Plans a trip");

        #[derive(Deserialize, JsonSchema)]
        #[allow(dead_code)]
        struct Tree {
            label: String,
            children: Vec<Tree>,
        }

        #[derive(Deserialize, JsonSchema)]
        struct NoFields {}

        #[test]
        fn derived_schemas_are_openai_object_schemas() {
            let schema = PLAN.parameters();
            assert_eq!(schema["type"], "object");
            assert_eq!(schema["required"], json!(["from", "to"]));
            for key in ["$schema", "title", "$defs", "definitions"] {
                assert!(schema.get(key).is_none(), "{key} in {schema}");
            }
            assert!(!schema.to_string().contains("$ref"), "inlined: {schema}");
            let from = &schema["properties"]["from"];
            assert_eq!(from["type"], "object");
            assert_eq!(from["description"], "Where from");
            assert_eq!(from["required"], json!(["name"]));
            assert!(schema["properties"].get("when").is_some(), "serde renames");
            assert_eq!(schema["properties"]["stops"]["items"]["type"], "object");
            assert_eq!(
                PLAN.definition()["function"]["parameters"],
                PLAN.parameters()
            );
            // The schema describes what the tool decodes.
            assert_eq!(
                PLAN.call(r#"{"from":{"name":"A"},"to":{"name":"B"},"stops":[{"name":"C"}]}"#),
                Ok("1 stops".to_owned())
            );
        }

        #[test]
        fn odd_argument_types() {
            assert_eq!(
                parameters_schema::<NoFields>(),
                json!({"type": "object", "properties": {}, "required": []})
            );
            // Any value, or a map: still an object schema.
            assert_eq!(
                parameters_schema::<Value>(),
                json!({"type": "object", "properties": {}, "required": []})
            );
            let map = parameters_schema::<BTreeMap<String, u8>>();
            assert_eq!(map["type"], "object");
            assert_eq!(map["additionalProperties"]["type"], "integer");
            // A recursive type cannot be inlined: it keeps its `$defs`, which the OpenAI
            // API also accepts.
            let tree = parameters_schema::<Tree>();
            assert_eq!(tree["type"], "object");
            assert_eq!(tree["required"], json!(["label", "children"]));
            assert!(tree.get("title").is_none() && tree.get("$schema").is_none());
        }

        #[test]
        fn openai_parameters_edges() {
            assert_eq!(
                openai_parameters(json!(true)),
                json!({"type": "object", "properties": {}, "required": []})
            );
            assert_eq!(
                openai_parameters(json!({"$schema": "x", "title": "T", "type": "object",
                                         "required": ["a"]})),
                json!({"type": "object", "properties": {}, "required": ["a"]})
            );
            // Not an object schema: left as it is (the model cannot call it well; use a
            // struct).
            assert_eq!(
                openai_parameters(json!({"type": "string"})),
                json!({"type": "string"})
            );
        }
    }

    #[test]
    fn deliver_never_writes_past_the_buffer() {
        let mut len = 2;
        assert_eq!(Reply::Write(vec![1; 3]).deliver(&mut [0; 2], &mut len), -5);
        let mut len = 0;
        assert_eq!(Reply::Write(Vec::new()).deliver(&mut [], &mut len), 0);
        assert_eq!(len, 0);
    }
}
