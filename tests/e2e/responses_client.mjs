// Drives ellm's POST /v1/responses with the official `openai` npm client. Usage:
//   node responses_client.mjs BASE_URL flow PATCH   on a server that scripts six replies in turn:
//       reasoning and text (create, then stream), a get_weather call and the answer after its
//       output, an apply_patch (custom tool) call and the answer after its output
//   node responses_client.mjs BASE_URL structured   text.format json_schema on a random model
// Every streamed event is checked (type, sequence, deltas adding up to the item that
// output_item.done carries and to the final response). Prints "ok" when all checks pass.
import OpenAI from "openai";

const [baseURL, mode, patch] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL: " + what);
    process.exit(1);
  }
}

const weatherTool = {
  type: "function", name: "get_weather", description: "Get the current weather for a city.",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
};
const patchTool = {
  type: "custom", name: "apply_patch", description: "Apply a patch to files.",
  format: { type: "grammar", syntax: "lark", definition: 'start: "*** Begin Patch" /(.|\\n)*/ "*** End Patch"' },
};

// The text of a response's message items (the SDK adds output_text to created responses only).
const textOf = (r) => r.output.filter((i) => i.type === "message").flatMap((i) => i.content).map((c) => c.text).join("");

// Streams a request and checks every event; returns the final response.
async function streamed(params) {
  const stream = client.responses.stream(params);
  const texts = new Map();  // output_index -> text built from deltas
  let sequence = 0, types = [];
  for await (const event of stream) {
    types.push(event.type);
    check(event.sequence_number === sequence++, `sequence_number of ${event.type}: ${event.sequence_number}`);
    if (event.type.endsWith(".delta")) texts.set(event.output_index, (texts.get(event.output_index) ?? "") + event.delta);
    if (event.type === "response.reasoning_text.delta") check(event.content_index === 0, "reasoning content_index");
    if (event.type === "response.output_item.done") {
      const item = event.item, built = texts.get(event.output_index) ?? "";
      const whole = item.type === "message" ? item.content[0].text : item.type === "reasoning" ? item.content[0].text
        : item.type === "function_call" ? item.arguments : item.input;
      check(whole === built, `${item.type} item: deltas ${JSON.stringify(built)} add up to ${JSON.stringify(whole)}`);
      check(item.status === "completed", `${item.type} item status ${item.status}`);
    }
  }
  check(types[0] === "response.created" && types[1] === "response.in_progress", `opening events ${types.slice(0, 2)}`);
  check(types.at(-1) === "response.completed", `last event ${types.at(-1)}`);
  const final = await stream.finalResponse();
  check(final.status === "completed" && final.id.startsWith("resp_"), `final status ${final.status}`);
  final.output.forEach((item, i) => {
    const whole = item.type === "message" ? item.content[0].text : item.type === "reasoning" ? item.content[0].text
      : item.type === "function_call" ? item.arguments : item.input;
    check(whole === (texts.get(i) ?? ""), `final output[${i}] matches its deltas`);
  });
  return final;
}

function checkUsage(r, what) {
  const u = r.usage;
  check(u.input_tokens > 0 && u.output_tokens > 0 && u.total_tokens === u.input_tokens + u.output_tokens, `${what}: usage ${JSON.stringify(u)}`);
  check(u.input_tokens_details.cached_tokens <= u.input_tokens, `${what}: cached_tokens`);
  check(u.output_tokens_details.reasoning_tokens > 0 && u.output_tokens_details.reasoning_tokens < u.output_tokens,
    `${what}: reasoning_tokens ${u.output_tokens_details.reasoning_tokens} of ${u.output_tokens}`);
}

async function flow() {
  const model = (await client.models.list()).data[0].id;
  const hello = { model, instructions: "Be brief.", input: "Hello!", reasoning: { effort: "medium" }, store: false };
  const created = await client.responses.create(hello);
  check(created.object === "response" && created.status === "completed", `create: status ${created.status}`);
  check(created.output.map((i) => i.type).join() === "reasoning,message", `create: items ${created.output.map((i) => i.type)}`);
  check(created.output_text === "Hello there." && textOf(created) === created.output_text, `create: output_text ${JSON.stringify(created.output_text)}`);
  check(created.output[0].content[0].text === "Let me greet them.", `create: reasoning ${JSON.stringify(created.output[0])}`);
  checkUsage(created, "create");

  const again = await streamed(hello);
  check(textOf(again) === created.output_text, "stream: the same text as create");
  check(again.usage.input_tokens_details.cached_tokens > 0, "stream: the repeated prompt is cached");

  // A function call, its output, and the answer; the follow-up reuses the first prompt.
  const ask = { model, input: [{ role: "user", content: "Weather in Paris?" }], tools: [weatherTool], store: false };
  const first = await streamed(ask);
  const call = first.output.find((i) => i.type === "function_call");
  check(call && call.name === "get_weather" && JSON.parse(call.arguments).city === "Paris" && call.call_id,
    `function call: ${JSON.stringify(first.output)}`);
  const second = await streamed({
    ...ask, input: [...ask.input, ...first.output, { type: "function_call_output", call_id: call.call_id, output: "sunny, 21 C" }],
  });
  check(textOf(second) === "It is sunny in Paris.", `answer after the call: ${JSON.stringify(second.output)}`);
  const cached = second.usage.input_tokens_details.cached_tokens;
  check(cached >= 0.95 * first.usage.input_tokens, `follow-up cached ${cached} of the first ${first.usage.input_tokens}`);

  // A custom (freeform) tool: its raw text comes back as custom_tool_call.input. Hosted tools
  // (web_search) are skipped.
  const edit = { model, input: "Fix the typo.", tools: [patchTool, { type: "web_search" }], store: false };
  const third = await streamed(edit);
  const custom = third.output.find((i) => i.type === "custom_tool_call");
  check(custom && custom.name === "apply_patch" && custom.input === patch, `custom tool call: ${JSON.stringify(third.output)}`);
  const fourth = await streamed({
    ...edit, input: [{ role: "user", content: "Fix the typo." }, ...third.output,
      { type: "custom_tool_call_output", call_id: custom.call_id, output: "Done!" }],
  });
  check(textOf(fourth) === "Patched.", `answer after the patch: ${JSON.stringify(fourth.output)}`);
  check(fourth.usage.input_tokens_details.cached_tokens >= 0.95 * third.usage.input_tokens, "custom follow-up cached");
}

async function structured() {
  const model = (await client.models.list()).data[0].id;
  const schema = {
    type: "object", properties: { city: { type: "string", maxLength: 12 }, days: { type: "integer" } },
    required: ["city", "days"], additionalProperties: false,
  };
  const params = {
    model, input: "Plan a trip.", reasoning: { effort: "none" }, max_output_tokens: 100, temperature: 1, seed: 5,
    text: { format: { type: "json_schema", name: "trip", schema, strict: true } },
  };
  for (const r of [await client.responses.create(params), await streamed(params)]) {
    const value = JSON.parse(textOf(r));
    check(typeof value.city === "string" && Number.isInteger(value.days) && Object.keys(value).length === 2,
      `json_schema output ${textOf(r)}`);
  }
  // Logprobs of the message text, with the asked-for alternatives.
  const scored = await client.responses.create({ ...params, top_logprobs: 2, include: ["message.output_text.logprobs"] });
  const part = scored.output.find((i) => i.type === "message").content[0];
  check(part.logprobs.length >= 1 && part.logprobs.length <= scored.usage.output_tokens &&
        part.logprobs.every((l) => typeof l.logprob === "number" && l.top_logprobs.length === 2),
        `logprobs: ${part.logprobs.length} for ${scored.usage.output_tokens} tokens`);

  // tool_choice "required": the grammar forces a call of a declared function.
  const forced = await streamed({
    model, input: "Weather?", tool_choice: "required",
    tools: [{ ...weatherTool, parameters: { ...weatherTool.parameters, properties: { city: { type: "string", maxLength: 12 } } } }], parallel_tool_calls: false,
    reasoning: { effort: "none" }, max_output_tokens: 100, temperature: 1, seed: 5,
  });
  const calls = forced.output.filter((i) => i.type === "function_call");
  check(calls.length === 1 && calls[0].name === "get_weather" && typeof JSON.parse(calls[0].arguments).city === "string",
    `required: ${JSON.stringify(forced.output)}`);
}

try {
  if (mode === "flow") await flow();
  else if (mode === "structured") await structured();
  else check(false, "unknown mode " + mode);
  console.log("ok");
} catch (e) {
  console.error("FAIL: " + (e.stack ?? e));
  process.exit(1);
}
