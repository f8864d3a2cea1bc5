// Drives ellm serve with the official `openai` npm client. Usage:
//   node openai_client.mjs BASE_URL basic   list models, chat, streaming chat, completions
//   node openai_client.mjs BASE_URL tools   tool call round trip (the server scripts the output)
//   node openai_client.mjs BASE_URL structured   response_format json_schema and tool_choice
//                                                "required" enforced on a random-weight model
// Prints "ok" and exits 0 when every check passes; otherwise prints the failure and exits 1.
import OpenAI from "openai";

const [baseURL, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "unused", maxRetries: 0 });

function check(cond, what) {
  if (!cond) {
    console.error("FAIL: " + what);
    process.exit(1);
  }
}

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather for a city.",
    parameters: {
      type: "object", properties: { city: { type: "string" }, unit: { enum: ["celsius", "fahrenheit"] } }, required: ["city"],
    },
  },
}];

async function basic() {
  const models = await client.models.list();
  const model = models.data[0].id;
  check(models.data.length === 1 && model.length > 0, "models.list");

  const messages = [{ role: "user", content: "Hello!" }];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0 });
  check(chat.choices[0].message.role === "assistant", "chat role");
  check(chat.usage.completion_tokens === 6 && chat.usage.prompt_tokens > 0, "chat usage");
  check(chat.choices[0].finish_reason === "length", "chat finish_reason");

  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = "", finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.delta.content ?? "";
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(text === chat.choices[0].message.content, `stream text ${JSON.stringify(text)}`);
  check(finish === "length" && usage && usage.completion_tokens === 6, "stream finish and usage");
  check(usage.prompt_tokens_details.cached_tokens > 0, "second identical prompt hits the session cache");

  const comp = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
  check(comp.choices[0].text.length > 0 && comp.usage.completion_tokens === 4, "completions");
  const compStream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 4, temperature: 0, stream: true });
  let compText = "";
  for await (const chunk of compStream) compText += chunk.choices[0]?.text ?? "";
  check(compText === comp.choices[0].text, "completions stream");

  try {
    await client.chat.completions.create({ model: "nope", messages });
    check(false, "unknown model accepted");
  } catch (e) {
    check(e.status === 404, `unknown model status ${e.status}`);
  }
}

async function tools_round_trip() {
  const model = (await client.models.list()).data[0].id;
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];

  const reply = await client.chat.completions.create({ model, messages, tools, temperature: 0 });
  const message = reply.choices[0].message;
  check(reply.choices[0].finish_reason === "tool_calls", `finish_reason ${reply.choices[0].finish_reason}`);
  check(message.tool_calls?.length === 1, "one tool call");
  const call = message.tool_calls[0];
  check(call.type === "function" && call.function.name === "get_weather" && call.id, "call fields");
  check(JSON.parse(call.function.arguments).city === "Paris", `arguments ${call.function.arguments}`);

  // Streaming (tool_choice auto): id and name first, then the arguments in several deltas as
  // they are generated, adding up to the whole reply's arguments.
  const stream = await client.chat.completions.create({ model, messages, tools, temperature: 0, stream: true });
  let name = "", args = "", id = "", finish = null, content = "", pieces = 0;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      content += choice.delta.content ?? "";
      for (const tc of choice.delta.tool_calls ?? []) {
        check(tc.index === 0, "tool call index");
        if (tc.id) id = tc.id;
        check(id && (name || tc.function?.name), `id and name before the arguments: ${JSON.stringify(tc)}`);
        name += tc.function?.name ?? "";
        if (tc.function?.arguments) args += tc.function.arguments, pieces++;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(id && name === "get_weather" && args === call.function.arguments && pieces > 1, `streamed call ${name} ${args} in ${pieces}`);
  check(finish === "tool_calls", `streamed finish ${finish}`);
  check(!content.includes("<tool_call>"), "no raw tags in content");
  // The client's own stream helper rebuilds the same call from the deltas.
  let deltas = 0;
  const helper = client.beta.chat.completions.stream({ model, messages, tools, temperature: 0 });
  helper.on("tool_calls.function.arguments.delta", (e) => { if (e.arguments_delta) deltas++; });
  const rebuilt = (await helper.finalChatCompletion()).choices[0].message.tool_calls[0];
  check(rebuilt.id && rebuilt.function.name === "get_weather" && rebuilt.function.arguments === call.function.arguments && deltas > 1,
        `stream helper: ${JSON.stringify(rebuilt)} from ${deltas} deltas`);

  // The tool result goes back; the template must render the call and the result. With
  // tool_choice "none" the (scripted) reply is plain content: the answer.
  const followUp = [...messages, message, { role: "tool", tool_call_id: call.id, content: '{"temperature": 21}' }];
  const answer = await client.chat.completions.create({ model, messages: followUp, tools, tool_choice: "none", temperature: 0 });
  check(answer.choices[0].finish_reason === "stop", "answer finish_reason");
  check(!answer.choices[0].message.tool_calls, "no tool calls with tool_choice none");
  check(answer.choices[0].message.content.includes("get_weather"), "answer content");
  check(answer.usage.prompt_tokens > reply.usage.prompt_tokens, "the tool round trip is in the prompt");
}

// Constrained decoding through the client: a json_schema reply parses and fits the schema, and a
// forced tool call comes back as a call (streamed too) whose arguments fit the tool's parameters.
async function structured() {
  const model = (await client.models.list()).data[0].id;
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const schema = {
    type: "object",
    properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["C", "F"] }, days: { type: "integer" } },
    required: ["city", "unit", "days"], additionalProperties: false,
  };
  const sampling = { temperature: 1, top_p: 1, seed: 5, max_tokens: 60 };
  const reply = await client.chat.completions.create({
    model, messages, ...sampling,
    response_format: { type: "json_schema", json_schema: { name: "weather", schema, strict: true } },
  });
  const value = JSON.parse(reply.choices[0].message.content);
  check(reply.choices[0].finish_reason === "stop", `json_schema finish_reason ${reply.choices[0].finish_reason}`);
  check(typeof value.city === "string" && value.city.length <= 12 && ["C", "F"].includes(value.unit) &&
        Number.isInteger(value.days) && Object.keys(value).length === 3, `json_schema reply ${JSON.stringify(value)}`);

  const forced = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", ...sampling, max_tokens: 100 });
  const calls = forced.choices[0].message.tool_calls ?? [];
  check(forced.choices[0].finish_reason === "tool_calls" && calls.length >= 1, `required: ${JSON.stringify(forced.choices[0])}`);
  for (const call of calls) {
    check(call.function.name === "get_weather" && typeof JSON.parse(call.function.arguments).city === "string",
          `required call ${JSON.stringify(call)}`);
  }
  const stream = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", parallel_tool_calls: false, ...sampling, max_tokens: 100, stream: true,
  });
  let name = "", args = "", finish = null, pieces = 0;
  for await (const chunk of stream) {
    for (const choice of chunk.choices) {
      for (const tc of choice.delta.tool_calls ?? []) {
        check(tc.index === 0, "one call with parallel_tool_calls false");
        name += tc.function?.name ?? "";
        if (tc.function?.arguments) args += tc.function.arguments, pieces++;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  check(name === "get_weather" && typeof JSON.parse(args).city === "string" && pieces > 1, `streamed call ${name} ${args}`);
  check(finish === "tool_calls", `streamed finish ${finish}`);
}

try {
  if (mode === "basic") await basic();
  else if (mode === "structured") await structured();
  else if (mode === "tools") await tools_round_trip();
  else check(false, "unknown mode " + mode);
  console.log("ok");
} catch (e) {
  console.error("FAIL: " + (e.stack || e));
  process.exit(1);
}
